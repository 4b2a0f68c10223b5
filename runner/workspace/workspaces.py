"""Slot work trees and job snapshots, all backed by one bare cache per source repo.

On disk, under ``$SLOTRUNNER_HOME``::

    repos/<key>.git      bare cache of one source (path or URL): cloned once, fetched
                         when a job's base is not there yet (or names a branch/tag)
    repos/<key>.lock     filelock: clone, fetch, worktree add/remove, ref updates
    slots/<id>/work/     a linked worktree of one cache (``git worktree add --detach``),
                         reused job after job; it holds the checkout and its ``.git``
                         file, nothing of slotrunner's

``Workspaces`` is the one class callers use. It is built in layers, one concept per
module, each layer using only those below it:

    runner.workspace.git       how every git call is run (pinned env and config);
                               ``WorkspaceError``
    runner.workspace.source    a source path or URL checked, and its cache ``<key>``
    runner.workspace.refs      snapshot ref names, and which job ids may have them
    runner.workspace.fs        deleting what code run in a tree left behind
    runner.workspace.cache     ``RepoCaches``: clone, fetch, resolve a job's base
    runner.workspace.tree      ``SlotWorkTrees``: attach, recycle, discard a slot's
                               tree; the tree id of what is in it
    runner.workspace.snapshot  ``SnapshotStore``: take, find and diff snapshots
    runner.workspace.workspaces           ``Workspaces``: ``prepare`` a slot for a job (base
                               resolved, tree recycled, start snapshot taken) and
                               ``restore`` a snapshot into a slot or a new directory

The names other modules import from here (``Workspaces``, ``Prepared``,
``WorkspaceError``, ``snapshot_ref``, ...) stay importable from here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from runner.workspace.git import WorkspaceError
from runner.workspace.refs import SNAPSHOT_KINDS, SNAPSHOT_REFS, check_job_id, snapshot_ref
from runner.workspace.snapshot import SnapshotStore
from runner.workspace.source import parse_source
from runner.workspace.tree import WORK_DIR

__all__ = [
    "SNAPSHOT_KINDS",
    "SNAPSHOT_REFS",
    "WORK_DIR",
    "Prepared",
    "WorkspaceError",
    "Workspaces",
    "check_job_id",
    "snapshot_ref",
]


@dataclass(frozen=True)
class Prepared:
    repo_key: str
    base_commit: str
    start_commit: str
    start_tree: str


class Workspaces(SnapshotStore):
    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.slots_dir = self.home / "slots"

    def prepare(
        self,
        slot_dir: Path,
        source: str,
        base: str,
        job_id: str,
        fence: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> Prepared:
        """Resolve ``base`` in the source's cache, then recycle the slot's tree to it.

        Only the recycle and the start snapshot touch the slot, so only they run
        inside ``fence`` (``runner.slots.fence``: the slot lock, the lease proved); a slow
        clone or fetch does not hold the slot.
        """
        check_job_id(job_id)
        src = parse_source(source)
        cache = self._cache_path(src)
        work = Path(slot_dir).resolve() / WORK_DIR
        with self._lock(cache):
            cache, fresh = self._ensure_cache(src)
            base_commit = self._resolve_base(cache, source, base, fresh)
        with fence():
            tree, start_tree = self._recycle(work, cache, base_commit)
            commit = self._commit_snapshot(tree, job_id, "start", base_commit, start_tree)
        return Prepared(src.key, base_commit, commit, start_tree)

    def restore(self, job_id: str, which: str, target: Path) -> str:
        hit = self.find_snapshot(job_id, which)
        if hit is None:
            raise WorkspaceError(f"no {which!r} snapshot of job {job_id!r} under {self.repos_dir}")
        cache, commit, expected = hit
        target = Path(target).resolve()
        if self._worktree_of(target) is not None or self._is_slot_work(target):
            self._restore_into_worktree(target, cache, commit)
        else:
            self._restore_into_fresh_dir(target, cache, commit)
        actual = self.tree_of_dir(target, cache)
        if actual != expected:
            raise WorkspaceError(
                f"restore of job {job_id!r} ({which}) into {target} gave tree {actual}, "
                f"not the snapshot's tree {expected}"
            )
        return actual

    def _is_slot_work(self, target: Path) -> bool:
        return target.name == WORK_DIR and target.parent.parent == self.slots_dir

    def _restore_into_worktree(self, work: Path, cache: Path, commit: str) -> None:
        tree = self._checkout(work, cache, commit)
        # Leave HEAD at the job's base with the snapshot's changes in the tree (new
        # files untracked again), which is what the job itself saw.
        base = self._commit_of(cache, f"{commit}^1")
        if base is not None:
            self._git(*tree.args(), "reset", "--quiet", "--mixed", base, env=tree.env())

    def _restore_into_fresh_dir(self, target: Path, cache: Path, commit: str) -> None:
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise WorkspaceError(
                f"restore target {target} is not empty: give a new or empty directory, "
                "or a slot's work tree"
            )
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="slotrunner-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            where = ("--git-dir", str(cache), "--work-tree", str(target))
            self._git(*where, "read-tree", commit, env=env)
            self._git("-C", str(target), *where, "checkout-index", "--all", "--force", env=env)
