"""Job snapshots: commits of a slot's work tree in its cache, found again by job id.

Snapshots are commits in the cache under ``refs/slotrunner/snapshots/<job_id>/start``
and ``/end`` (the ref namespace is shared by every worktree of the cache), parent =
the job's base. Each records the work tree's tree id as ``runner.workspace.tree``
takes it: untracked files included, ignored files left out.

``tree_of_dir`` is stricter: the tree of *everything* in a directory (ignore rules
off, ``.git`` skipped). Restore uses it to prove a restored directory holds exactly
the snapshot, nothing less and nothing more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from runner.workspace.git import WorkspaceError
from runner.workspace.refs import check_job_id, check_which, snapshot_ref
from runner.workspace.tree import SlotWorkTrees, WorkTree


class SnapshotStore(SlotWorkTrees):
    def snapshot(self, slot_dir: Path, job_id: str, which: str) -> tuple[str, str]:
        check_job_id(job_id)
        check_which(which)
        tree = self._require_worktree(slot_dir)
        start = self._ref_target(tree.cache, snapshot_ref(job_id, "start"))
        # The parent is the job's base (the start snapshot's parent), even when the
        # agent committed on top of it; without a start, the tree's HEAD.
        parent = (
            self._commit_of(tree.cache, f"{start[0]}^1")
            if start
            else self._commit_of(tree.admin, "HEAD")  # the worktree's HEAD, not the cache's
        )
        if parent is None:
            raise WorkspaceError(f"{tree.work} has no HEAD commit to snapshot against")
        return self._snapshot(tree, job_id, which, parent)

    def _snapshot(self, tree: WorkTree, job_id: str, which: str, parent: str) -> tuple[str, str]:
        tree_id = self._worktree_tree(tree)
        return self._commit_snapshot(tree, job_id, which, parent, tree_id), tree_id

    def _commit_snapshot(
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
        with self._lock(tree.cache):
            ref = snapshot_ref(job_id, which)
            self._git("--git-dir", str(tree.cache), "update-ref", ref, commit)
        return commit

    def diff(self, slot_dir: Path, base_commit: str) -> str:
        tree = self._require_worktree(slot_dir)
        base = self._commit_of(tree.cache, base_commit) if base_commit else None
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
            self._worktree_tree(tree),
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
        for cache in sorted(self.repos_dir.glob("*.git")) if self.repos_dir.is_dir() else []:
            if (hit := self._ref_target(cache, snapshot_ref(job_id, which))) is not None:
                found.append((hit[2], cache, hit[0], hit[1]))
        if not found:
            return None
        # One job id used against two repos: the newest snapshot is the one meant.
        _, cache, commit, tree_id = max(found, key=lambda f: f[0])
        return cache, commit, tree_id
