"""The repositories of each source under ``$SLOTRUNNER_HOME/repos``, and their lock.

``repos/<key>.mirror`` is a bare clone of the source, written only by clone and fetch:
cloned once (beside it, then renamed, so a crash never leaves a half clone), fetched
only when a job's base is not a commit it already holds, or names a branch or tag
that may have moved; every base a job used is kept by a ref
``refs/slotrunner/bases/<commit>``. ``repos/<key>.git`` (the *cache*) is the runner's
repository of the source: the slots' worktrees and the snapshot refs; its objects
borrow the mirror's (``objects/info/alternates``), and what it writes (snapshots,
commits) stays in it. Agents' git dirs borrow the mirror's objects only, so no
sandbox can read another job's trees (docs/architecture.md §Agent git).
``repos/<key>.lock`` guards clone, fetch, worktree add/remove and ref updates. The
bottom layer of ``Workspaces``: it uses no other, and holds the one git runner every
layer above it shares.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from runner.workspace.fs import remove_tree
from runner.workspace.git import GitRunner, WorkspaceError
from runner.workspace.source import Source, parse_source
from tools.sandbox.layout import MIRROR_SUFFIX

# A whole commit id (SHA-1 or SHA-256), as git prints it: it names one commit forever.
FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
BASE_REFS = "refs/slotrunner/bases"


def mirror_of(cache: Path) -> Path:
    """``repos/<key>.mirror``, the source's clone that the cache ``repos/<key>.git`` borrows."""
    return cache.with_suffix(MIRROR_SUFFIX)


def _alternate(cache: Path) -> str:
    # Relative to the cache's objects dir, so a moved $SLOTRUNNER_HOME keeps working.
    return f"../../{mirror_of(cache).name}/objects"


class RepoCaches:
    """The caches of every source under ``home/repos``."""

    def __init__(self, home: Path) -> None:
        # Resolved once: worktree back-pointers are compared as resolved paths, and a
        # symlinked home must not make every slot look like it belongs elsewhere.
        self.home = Path(home).resolve()
        self.repos_dir = self.home / "repos"
        self._git = GitRunner()

    @property
    def git(self) -> GitRunner:
        """The git runner of these caches, shared by the layers built on them."""
        return self._git

    def cache_for(self, source: str) -> Path:
        src = parse_source(source)
        with self.lock(self.cache_path(src)):
            return self.ensure_cache(src)[0]

    def cache_path(self, src: Source) -> Path:
        return self.repos_dir / f"{src.key}.git"

    @contextmanager
    def lock(self, cache: Path) -> Iterator[None]:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache.with_suffix(".lock"))):
            yield

    def ensure_cache(self, src: Source) -> tuple[Path, bool]:
        """Clone the mirror and make the cache if missing (caller holds the lock).

        True when the mirror was just cloned (nothing to fetch). A cache from before
        the mirror existed (it holds the source's objects itself) is kept, snapshots
        and all, and borrows from a new mirror from then on.
        """
        cache = self.cache_path(src)
        fresh = self._ensure_mirror(src, mirror_of(cache))
        if (cache / "HEAD").is_file():
            self._borrow(cache, cache)
            return cache, fresh
        if cache.exists():
            # Never delete it ourselves: it may still hold snapshot refs worth saving.
            raise WorkspaceError(f"repo cache {cache} is damaged (no HEAD); move it aside")
        partial = cache.with_name(f".{cache.name}.partial")
        remove_tree(partial)
        self._git("init", "--bare", "--quiet", str(partial), what="init")
        self._borrow(partial, cache)
        partial.rename(cache)
        return cache, fresh

    def _ensure_mirror(self, src: Source, mirror: Path) -> bool:
        if (mirror / "HEAD").is_file():
            return False
        if mirror.exists():
            raise WorkspaceError(f"repo mirror {mirror} is damaged (no HEAD); move it aside")
        # Clone beside it and rename, so a crash mid-clone never leaves a half mirror
        # that later jobs would take for a whole one.
        partial = mirror.with_name(f".{mirror.name}.partial")
        remove_tree(partial)
        self._git("clone", "--bare", "--quiet", "--", src.spec, str(partial), what="clone")
        for refspec in ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"):
            self._git("--git-dir", str(partial), "config", "--add", "remote.origin.fetch", refspec)
        partial.rename(mirror)
        return True

    def _borrow(self, git_dir: Path, cache: Path) -> None:
        """Make ``git_dir`` (``cache`` or its partial) read the mirror's objects, once."""
        alternates = git_dir / "objects" / "info" / "alternates"
        line = _alternate(cache)
        try:
            if line in alternates.read_text().splitlines():
                return
        except FileNotFoundError:
            pass
        alternates.parent.mkdir(parents=True, exist_ok=True)
        with alternates.open("a") as handle:
            handle.write(line + "\n")

    def keep_base(self, cache: Path, commit: str) -> None:
        """Keep ``commit`` reachable in the mirror: snapshots in the cache stand on it."""
        mirror = mirror_of(cache)
        ref = f"{BASE_REFS}/{commit}"
        if not (mirror / ref).is_file():  # packed by a gc: written loose again, harmless
            self._git("--git-dir", str(mirror), "update-ref", ref, commit, what="update-ref")

    def resolve_base(self, cache: Path, source: str, base: str, fresh: bool) -> str:
        """The commit `base` names, fetching when it is not a commit the mirror holds."""
        if not base or base.startswith("-") or any(c in base for c in "\x00\n\r"):
            raise WorkspaceError(f"base {base!r} is not a commit-ish")
        mirror = mirror_of(cache)
        if FULL_SHA.fullmatch(base):
            # A commit id never moves: no fetch needed. One that keep_base kept has its
            # loose ref, written by update-ref only for a commit rev-parse proved: it is
            # in the mirror and reachable (no gc prunes it), no git process needed.
            if (mirror / BASE_REFS / base).is_file():
                return base
            if found := self.commit_of(mirror, base):
                return found
        # A branch or tag name may have moved in the source since the last fetch: ask.
        if not fresh:
            self._git("--git-dir", str(mirror), "fetch", "-q", "--prune", "origin", what="fetch")
        if found := self.commit_of(mirror, base):
            return found
        # Not on any branch or tag: a bare commit id or a ref such as refs/pull/1/head.
        status, _, _ = self._git(
            "--git-dir", str(mirror), "fetch", "--quiet", "origin", base, check=False
        )
        found = self.commit_of(mirror, "FETCH_HEAD") if status == 0 else None
        if found and (not FULL_SHA.fullmatch(base) or found == base):
            return found
        raise WorkspaceError(f"unknown base {base!r}: no such commit, branch or tag in {source}")

    def commit_of(self, git_dir: Path, rev: str) -> str | None:
        status, out, _ = self._git(
            "--git-dir",
            str(git_dir),
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            f"{rev}^{{commit}}",
            check=False,
        )
        return out.decode().strip() if status == 0 else None
