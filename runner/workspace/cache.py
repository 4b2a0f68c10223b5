"""The bare cache of each source repo under ``$SLOTRUNNER_HOME/repos``, and its lock.

``repos/<key>.git`` is cloned once (beside it, then renamed, so a crash never leaves a
half cache) and fetched only when a job's base is not a commit it already holds, or
names a branch or tag that may have moved. ``repos/<key>.lock`` guards clone, fetch,
worktree add/remove and ref updates. The bottom layer of ``Workspaces``: it uses
no other, and holds the one git runner every layer above it shares.
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

_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


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
        """Clone the cache if missing (caller holds its lock); True when just cloned."""
        cache = self.cache_path(src)
        if (cache / "HEAD").is_file():
            return cache, False
        if cache.exists():
            # Never delete it ourselves: it may still hold snapshot refs worth saving.
            raise WorkspaceError(f"repo cache {cache} is damaged (no HEAD); move it aside")
        # Clone beside it and rename, so a crash mid-clone never leaves a half cache
        # that later jobs would take for a whole one.
        partial = cache.with_name(f".{cache.name}.partial")
        remove_tree(partial)
        self._git("clone", "--bare", "--quiet", "--", src.spec, str(partial), what="clone")
        for refspec in ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"):
            self._git("--git-dir", str(partial), "config", "--add", "remote.origin.fetch", refspec)
        partial.rename(cache)
        return cache, True

    def resolve_base(self, cache: Path, source: str, base: str, fresh: bool) -> str:
        """The commit `base` names, fetching when it is not a commit the cache holds."""
        if not base or base.startswith("-") or any(c in base for c in "\x00\n\r"):
            raise WorkspaceError(f"base {base!r} is not a commit-ish")
        if _FULL_SHA.fullmatch(base) and (found := self.commit_of(cache, base)):
            return found  # a commit id never moves: no fetch needed
        # A branch or tag name may have moved in the source since the last fetch: ask.
        if not fresh:
            self._git("--git-dir", str(cache), "fetch", "-q", "--prune", "origin", what="fetch")
        if found := self.commit_of(cache, base):
            return found
        # Not on any branch or tag: a bare commit id or a ref such as refs/pull/1/head.
        status, _, _ = self._git(
            "--git-dir", str(cache), "fetch", "--quiet", "origin", base, check=False
        )
        found = self.commit_of(cache, "FETCH_HEAD") if status == 0 else None
        if found and (not _FULL_SHA.fullmatch(base) or found == base):
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
