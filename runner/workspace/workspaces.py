"""Slot work trees and job snapshots, all backed by one bare cache per source repo.

On disk, under ``$SLOTRUNNER_HOME``::

    repos/<key>.mirror   bare clone of one source (path or URL): cloned once, fetched
                         when a job's base is not there yet (or names a branch/tag)
    repos/<key>.git      the cache: the slots' worktrees and the snapshot refs; its
                         objects borrow the mirror's
    repos/<key>.lock     filelock: clone, fetch, worktree add/remove, ref updates
    slots/<id>/work/     a linked worktree of one cache (``git worktree add --detach``),
                         reused job after job; it holds the checkout and its ``.git``
                         file, nothing of slotrunner's
    slots/<id>/agent.git the agent's own git dir, made anew for every job (with
                         ``source-objects`` and ``agent.gitfile`` beside it)

``Workspaces`` is the one class callers use: a facade that builds three layers (cache,
tree, snapshot), each an object holding the ones below it, on helpers of one concept
per module:

    runner.workspace.git       how every git call is run (pinned env and config);
                               ``WorkspaceError``
    runner.workspace.source    a source path or URL checked, and its cache ``<key>``
    runner.workspace.refs      snapshot ref names, and which job ids may have them
    runner.workspace.fs        deleting what code run in a tree left behind
    runner.workspace.cache     ``RepoCaches``: clone, fetch, resolve a job's base;
                               the cache lock and the one git runner
    runner.workspace.agent_git the agent's git dir of a slot, reset for each job
    runner.workspace.tree      ``SlotWorkTrees(caches)``: attach, recycle, discard a
                               slot's tree; the tree id of what is in it
    runner.workspace.snapshot  ``SnapshotStore(caches, trees)``: take, find, diff and
                               restore snapshots
    runner.workspace.workspaces  ``Workspaces(home)``: builds the three, and
                               ``prepare``s a slot for a job (base resolved, tree
                               recycled, start snapshot taken, agent git dir made)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from runner.workspace import agent_git
from runner.workspace.cache import RepoCaches, mirror_of
from runner.workspace.refs import check_job_id
from runner.workspace.snapshot import SnapshotStore
from runner.workspace.source import parse_source
from runner.workspace.tree import WORK_DIR, SlotWorkTrees


@dataclass(frozen=True)
class Prepared:
    repo_key: str
    base_commit: str
    start_commit: str
    start_tree: str


class Workspaces:
    """The slots' work trees and the jobs' snapshots under ``home`` (see the module docstring)."""

    def __init__(self, home: Path) -> None:
        self.caches = RepoCaches(home)
        self.trees = SlotWorkTrees(self.caches)
        self.snapshots = SnapshotStore(self.caches, self.trees)
        self.home = self.caches.home
        self.repos_dir = self.caches.repos_dir
        self.slots_dir = self.trees.slots_dir

    def prepare(
        self,
        slot_dir: Path,
        source: str,
        base: str,
        job_id: str,
        fence: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> Prepared:
        """Resolve ``base`` in the source's cache, then recycle the slot's tree to it.

        The agent's git dir is deleted first and made anew at the base last, so nothing
        of the previous job's git state survives even a prepare that fails half-way
        (docs/architecture.md §Agent git). Only the recycle, the start snapshot and the
        agent's git dir touch the slot, so only they run inside ``fence``
        (``runner.slots.fence``: the slot lock, the lease proved); a slow clone or fetch
        does not hold the slot.
        """
        check_job_id(job_id)
        src = parse_source(source)
        cache = self.caches.cache_path(src)
        work = Path(slot_dir).resolve() / WORK_DIR
        with self.caches.lock(cache):
            cache, fresh = self.caches.ensure_cache(src)
            base_commit = self.caches.resolve_base(cache, source, base, fresh)
            self.caches.keep_base(cache, base_commit)
        with fence():
            agent_git.discard(work.parent)
            tree, start_tree = self.trees.recycle(work, cache, base_commit)
            commit = self.snapshots.commit_snapshot(tree, job_id, "start", base_commit, start_tree)
            agent_git.reset(work.parent, tree, mirror_of(cache) / "objects", base_commit)
        return Prepared(src.key, base_commit, commit, start_tree)

    def cache_for(self, source: str) -> Path:
        """The source's bare cache, cloned if this host has none yet."""
        return self.caches.cache_for(source)

    def snapshot(self, slot_dir: Path, job_id: str, which: str) -> tuple[str, str]:
        """Commit the slot's tree as the job's ``which`` snapshot: (commit, tree id)."""
        return self.snapshots.snapshot(slot_dir, job_id, which)

    def diff(self, slot_dir: Path, base_commit: str) -> str:
        """The slot's tree against ``base_commit``, as a unified diff."""
        return self.snapshots.diff(slot_dir, base_commit)

    def find_snapshot(self, job_id: str, which: str) -> tuple[Path, str, str] | None:
        """(cache, commit, tree id) of the job's ``which`` snapshot, None when it has none."""
        return self.snapshots.find_snapshot(job_id, which)

    def tree_of_dir(self, directory: Path, cache: Path) -> str:
        """The tree id of everything in ``directory`` (ignore rules off)."""
        return self.snapshots.tree_of_dir(directory, cache)

    def restore(self, job_id: str, which: str, target: Path) -> str:
        """Restore the job's ``which`` snapshot into ``target``; the tree id restored."""
        return self.snapshots.restore(job_id, which, target)
