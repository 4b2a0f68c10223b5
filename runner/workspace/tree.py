"""Slot work trees: ``slots/<id>/work/``, one linked worktree of a cache, reused job after job.

``git worktree add --detach`` makes it; it holds the checkout and its ``.git`` file,
nothing of slotrunner's. Each job gets it back at its base, pristine (``recycle``),
and a tree git cannot make pristine is started over, once. A ``.git`` file that does
not point back and forth between the tree and one of our caches is not adopted.
``SlotWorkTrees`` holds the ``RepoCaches`` whose worktrees these are, and takes their
lock and git runner.

The tree id of a work tree (``worktree_tree``) is what ``git add -A && git commit``
would record at that moment, built in a temporary index so the tree's own index and
HEAD are never touched: tracked files as they are on disk, plus **untracked** files,
minus **ignored** files (``.gitignore``, ``info/exclude``; the host user's global
excludes are switched off, so one tree gives one id on every host). Ignored files are
left out because they are build output and caches the job can regenerate, and
restoring them would hide that a job depended on them.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runner.core.git import add_all, stderr_of
from runner.workspace.cache import FULL_SHA, RepoCaches
from runner.workspace.fs import remove_nested_git, remove_tree
from runner.workspace.git import WorkspaceError

WORK_DIR = "work"
# How many (repository, commit) -> tree answers tree_of keeps before starting over.
_COMMIT_TREES_KEPT = 256


@dataclass(frozen=True)
class WorkTree:
    work: Path
    admin: Path  # <cache>/worktrees/<name>
    cache: Path

    def args(self) -> tuple[str, ...]:
        # Explicit --git-dir/--work-tree: if work/.git went missing, git must not walk
        # up and reset or clean whatever repository encloses $SLOTRUNNER_HOME.
        return ("--git-dir", str(self.admin), "--work-tree", str(self.work))

    def env(self) -> dict[str, str]:
        return {"GIT_INDEX_FILE": str(self.admin / "index")}


class SlotWorkTrees:
    """The work trees of the slots under ``home/slots``, linked to the caches of ``caches``."""

    def __init__(self, caches: RepoCaches) -> None:
        self.caches = caches
        self.slots_dir = caches.home / "slots"
        self._git = caches.git
        # (repository, full commit id) -> the commit's tree id: tree_of's answers.
        self._commit_trees: dict[tuple[str, str], str] = {}

    def is_slot_work(self, target: Path) -> bool:
        """True when ``target`` is where a slot's work tree lives (``slots/<id>/work``)."""
        return target.name == WORK_DIR and target.parent.parent == self.slots_dir

    def recycle(self, work: Path, cache: Path, commit: str) -> tuple[WorkTree, str]:
        """Put `work` back at `commit`, pristine; returns it with its (start) tree id.

        The quick way first: ``checkout --force`` (index, HEAD and tracked files to the
        commit) and ``clean -ffdx`` (every untracked and ignored file; git exits
        non-zero when one cannot be removed). What neither exit code can promise --
        that the files on disk are the commit's, nothing more and nothing less -- the
        start snapshot proves: it is the tree of everything in `work` that is not
        ignored, so it equals the commit's tree exactly when the two reached it. That
        replaces a second full pass (``reset --hard``) and a third (``status
        --ignored``) over the tree. Anything else starts the slot's tree over.
        """
        tree = self._attach(work, cache, commit)
        try:
            remove_nested_git(work)
            self._git(*tree.args(), "checkout", "-q", "--force", "--detach", commit, env=tree.env())
            self._git(*tree.args(), "clean", "-ffdxq", env=tree.env())
            start_tree = self.worktree_tree(tree, nested=False)  # just removed
            if start_tree == self.tree_of(cache, commit):
                return tree, start_tree
        except WorkspaceError:
            pass
        # A read-only directory left by a test run, a stale index.lock from a killed
        # git, or files git would not touch: start this slot's tree over, once.
        self._discard(work)
        tree = self._attach(work, cache, commit)
        self._reset(tree, commit)
        return tree, self.worktree_tree(tree, nested=False)

    def tree_of(self, git_dir: Path, commit: str) -> str | None:
        """The tree id of ``commit`` in ``git_dir``; None when it has no such commit."""
        key = (str(git_dir), commit)
        if (known := self._commit_trees.get(key)) is not None:
            return known
        status, out, _ = self._git(
            "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet",
            "--end-of-options", f"{commit}^{{tree}}", check=False,
        )  # fmt: skip
        if status != 0:
            return None
        tree = out.decode().strip()
        if FULL_SHA.fullmatch(commit):
            # A commit id names one tree for good, and git never drops an object the
            # recycle stands on (the base ref keeps it): the answer is kept, since the
            # recycle asks it for the same few bases job after job.
            if len(self._commit_trees) >= _COMMIT_TREES_KEPT:
                self._commit_trees.clear()
            self._commit_trees[key] = tree
        return tree

    def checkout(self, work: Path, cache: Path, commit: str) -> WorkTree:
        """Make `work` a pristine worktree of `cache` at `commit`, reusing it if it is one."""
        tree = self._attach(work, cache, commit)
        try:
            self._reset(tree, commit)
            if not self._dirty(tree):
                return tree
        except WorkspaceError:
            pass
        # Reset could not make it pristine (a read-only directory left by a test run, a
        # stale index.lock from a killed git): start this slot's tree over, once.
        self._discard(work)
        tree = self._attach(work, cache, commit)
        self._reset(tree, commit)
        return tree

    def _attach(self, work: Path, cache: Path, commit: str) -> WorkTree:
        tree = self.worktree_of(work)
        if tree is not None and tree.cache == cache:
            return tree
        self._discard(work)
        with self.caches.lock(cache):
            self._git("--git-dir", str(cache), "worktree", "prune")
            work.parent.mkdir(parents=True, exist_ok=True)
            # No checkout under the lock: filling a large tree would stall every other
            # slot of this cache.
            self._git(
                "--git-dir",
                str(cache),
                "worktree",
                "add",
                "--detach",
                "--no-checkout",
                str(work),
                commit,
            )
        tree = self.worktree_of(work)
        if tree is None:
            raise WorkspaceError(f"git worktree add did not make {work} a work tree")
        return tree

    def _reset(self, tree: WorkTree, commit: str) -> None:
        remove_nested_git(tree.work)
        self._git(*tree.args(), "checkout", "-q", "--force", "--detach", commit, env=tree.env())
        self._git(*tree.args(), "reset", "--quiet", "--hard", commit, env=tree.env())
        self._git(*tree.args(), "clean", "-ffdxq", env=tree.env())

    def _dirty(self, tree: WorkTree) -> bool:
        _, out, _ = self._git(
            *tree.args(),
            "status",
            "--porcelain",
            "--ignored",
            "--untracked-files=all",
            env=tree.env(),
        )
        return bool(out.strip())

    def worktree_of(self, work: Path) -> WorkTree | None:
        """The cache `work` is a linked worktree of, if it is one of ours and intact."""
        dotgit = work / ".git"
        if dotgit.is_symlink() or not dotgit.is_file():
            return None
        text = dotgit.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        admin = (work / text.removeprefix("gitdir:").strip()).resolve()
        cache = admin.parent.parent
        back = admin / "gitdir"
        # Both pointers must agree: a .git file rewritten by code run in the tree must
        # not let this slot adopt another slot's worktree or a fake admin dir.
        if admin.parent.name != "worktrees" or cache.parent != self.caches.repos_dir:
            return None
        if not back.is_file() or Path(back.read_text().strip()).resolve() != dotgit.resolve():
            return None
        return WorkTree(work, admin, cache)

    def _discard(self, work: Path) -> None:
        """Remove `work`, deregistering it from its cache when it is a worktree of one."""
        tree = self.worktree_of(work)
        if tree is not None:
            with self.caches.lock(tree.cache):
                self._git(
                    "--git-dir",
                    str(tree.cache),
                    "worktree",
                    "remove",
                    "--force",
                    "--force",
                    str(work),
                    check=False,
                )
                remove_tree(work)  # when remove refused (submodules, permissions)
                self._git("--git-dir", str(tree.cache), "worktree", "prune")
        else:
            remove_tree(work)

    def require_worktree(self, slot_dir: Path) -> WorkTree:
        work = Path(slot_dir).resolve() / WORK_DIR
        tree = self.worktree_of(work)
        if tree is None:
            raise WorkspaceError(f"{work} is not a slotrunner work tree (prepare the slot first)")
        return tree

    def worktree_tree(self, tree: WorkTree, nested: bool = True) -> str:
        """The tree id of what is in ``tree`` now; ``nested=False`` when no nested repo is."""
        with tempfile.TemporaryDirectory(prefix="slotrunner-index-") as tmp:
            index = Path(tmp) / "index"
            real = tree.admin / "index"
            if real.is_file():
                # Seed with the tree's own index: tracked-but-ignored files stay tracked
                # and unchanged files are not re-hashed. copy2 keeps the index mtime, so
                # git's racy-clean check still re-hashes files changed in that second.
                shutil.copy2(real, index)
            env = {"GIT_INDEX_FILE": str(index)}
            # Not self._git("add", "--all"): that would run git inside a nested repo.
            added = add_all(tree.work, *tree.args(), env=env, nested=nested)
            if added.returncode != 0:
                err = stderr_of(added) or "-"
                raise WorkspaceError(f"git add failed (exit {added.returncode}): {err}")
            _, out, _ = self._git(*tree.args(), "write-tree", env=env)
        return out.decode().strip()
