"""Job snapshots: commits of a slot's work tree in its cache, found again by job id.

Snapshots are commits in the cache under ``refs/slotrunner/snapshots/<job_id>/start``
and ``/end`` (the ref namespace is shared by every worktree of the cache), parent =
the job's base. Each records the work tree's tree id as ``runner.workspace.tree``
takes it: untracked files included, ignored files left out.

``tree_of_dir`` is stricter: the tree of *everything* in a directory (ignore rules
off, ``.git`` skipped). ``restore`` uses it to prove a restored directory holds exactly
the snapshot, nothing less and nothing more.

``SnapshotStore`` holds the ``RepoCaches`` the snapshots live in and the
``SlotWorkTrees`` they are taken of and restored into.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from runner.workspace.cache import RepoCaches
from runner.workspace.git import WorkspaceError
from runner.workspace.refs import check_job_id, check_which, snapshot_ref
from runner.workspace.tree import SlotWorkTrees, WorkTree


class SnapshotStore:
    """Snapshots of the work trees of ``trees``, kept in the caches of ``caches``."""

    def __init__(self, caches: RepoCaches, trees: SlotWorkTrees) -> None:
        self.caches = caches
        self.trees = trees
        self._git = caches.git

    def snapshot(self, slot_dir: Path, job_id: str, which: str) -> tuple[str, str]:
        check_job_id(job_id)
        check_which(which)
        tree = self.trees.require_worktree(slot_dir)
        start = self._ref_target(tree.cache, snapshot_ref(job_id, "start"))
        # The parent is the job's base (the start snapshot's parent), even when the
        # agent committed on top of it; without a start, the tree's HEAD.
        parent = (
            self.caches.commit_of(tree.cache, f"{start[0]}^1")
            if start
            else self.caches.commit_of(tree.admin, "HEAD")  # the worktree's HEAD, not the cache's
        )
        if parent is None:
            raise WorkspaceError(f"{tree.work} has no HEAD commit to snapshot against")
        return self._snapshot(tree, job_id, which, parent)

    def _snapshot(self, tree: WorkTree, job_id: str, which: str, parent: str) -> tuple[str, str]:
        tree_id = self.trees.worktree_tree(tree)
        return self.commit_snapshot(tree, job_id, which, parent, tree_id), tree_id

    def commit_snapshot(
        self, tree: WorkTree, job_id: str, which: str, parent: str, tree_id: str
    ) -> str:
        _, out, _ = self._git(
            "--git-dir",
            str(tree.cache),
            "commit-tree",
            "--no-gpg-sign",
            tree_id,
            "-p",
            parent,
            "-m",
            f"slotrunner snapshot {which} of job {job_id}",
        )
        commit = out.decode().strip()
        with self.caches.lock(tree.cache):
            ref = snapshot_ref(job_id, which)
            self._git("--git-dir", str(tree.cache), "update-ref", ref, commit)
        return commit

    def diff(self, slot_dir: Path, base_commit: str) -> str:
        tree = self.trees.require_worktree(slot_dir)
        base = self.caches.commit_of(tree.cache, base_commit) if base_commit else None
        if base is None:
            raise WorkspaceError(f"unknown base commit {base_commit!r} in {tree.cache}")
        _, out, _ = self._git(
            "--git-dir",
            str(tree.cache),
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            base,
            self.trees.worktree_tree(tree),
            "--",
        )
        # Text for the job result: bytes that are not UTF-8 become U+FFFD.
        return out.decode("utf-8", errors="replace")

    def tree_of_dir(self, directory: Path, cache: Path) -> str:
        directory = Path(directory).absolute()
        if not directory.is_dir():
            raise WorkspaceError(f"{directory} is not a directory")
        with tempfile.TemporaryDirectory(prefix="slotrunner-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            where = ("--git-dir", str(cache), "--work-tree", str(directory))
            self._git("-C", str(directory), *where, "add", "--all", "--force", env=env)
            _, out, _ = self._git(*where, "write-tree", env=env)
        return out.decode().strip()

    def _ref_target(self, cache: Path, ref: str) -> tuple[str, str, int] | None:
        """(commit, tree, committer time) of `ref` in `cache`, or None if it is absent."""
        _, out, _ = self._git(
            "--git-dir",
            str(cache),
            "for-each-ref",
            "--format=%(objectname) %(tree) %(committerdate:raw)",
            ref,
        )
        fields = out.decode().split()
        if len(fields) < 3 or not fields[1]:
            return None
        return fields[0], fields[1], int(fields[2])

    def find_snapshot(self, job_id: str, which: str) -> tuple[Path, str, str] | None:
        check_job_id(job_id)
        check_which(which)
        found: list[tuple[int, Path, str, str]] = []
        repos_dir = self.caches.repos_dir
        for cache in sorted(repos_dir.glob("*.git")) if repos_dir.is_dir() else []:
            if (hit := self._ref_target(cache, snapshot_ref(job_id, which))) is not None:
                found.append((hit[2], cache, hit[0], hit[1]))
        if not found:
            return None
        # One job id used against two repos: the newest snapshot is the one meant.
        _, cache, commit, tree_id = max(found, key=lambda f: f[0])
        return cache, commit, tree_id

    def restore(self, job_id: str, which: str, target: Path) -> str:
        """Put the snapshot into ``target``, a slot's work tree or a new or empty directory.

        Returns the restored tree id, proved equal to the snapshot's (``tree_of_dir``).
        """
        hit = self.find_snapshot(job_id, which)
        if hit is None:
            raise WorkspaceError(
                f"no {which!r} snapshot of job {job_id!r} under {self.caches.repos_dir}"
            )
        cache, commit, expected = hit
        target = Path(target).resolve()
        if self.trees.worktree_of(target) is not None or self.trees.is_slot_work(target):
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

    def _restore_into_worktree(self, work: Path, cache: Path, commit: str) -> None:
        tree = self.trees.checkout(work, cache, commit)
        # Leave HEAD at the job's base with the snapshot's changes in the tree (new
        # files untracked again), which is what the job itself saw.
        base = self.caches.commit_of(cache, f"{commit}^1")
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
