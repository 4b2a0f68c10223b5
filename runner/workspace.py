"""Slot work trees and job snapshots, all backed by one bare cache per source repo.

On disk, under ``$SLOTRUNNER_HOME``::

    repos/<key>.git      bare cache of one source (path or URL): cloned once, fetched
                         when a job's base is not there yet (or names a branch/tag)
    repos/<key>.lock     filelock: clone, fetch, worktree add/remove, ref updates
    slots/<id>/work/     a linked worktree of one cache (``git worktree add --detach``),
                         reused job after job; it holds the checkout and its ``.git``
                         file, nothing of slotrunner's

``<key>`` is a readable name from the source plus 12 hex digits of the sha256 of the
normalised source (an absolute, resolved path or the URL), so two sources never share
a cache and two spellings of one local path do.

Snapshots are commits in the cache under ``refs/slotrunner/snapshots/<job_id>/start``
and ``/end`` (the ref namespace is shared by every worktree of the cache), parent =
the job's base. A snapshot records what ``git add -A && git commit`` would record in
the work tree at that moment, built in a temporary index so the tree's own index and
HEAD are never touched: tracked files as they are on disk, plus **untracked** files,
minus **ignored** files (``.gitignore``, ``info/exclude``; the host user's global
excludes are switched off, so one tree gives one id on every host). Ignored files are
left out because they are build output and caches the job can regenerate, and
restoring them would hide that a job depended on them.

``tree_of_dir`` is stricter: the tree of *everything* in a directory (ignore rules
off, ``.git`` skipped). Restore uses it to prove a restored directory holds exactly
the snapshot, nothing less and nothing more.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock
from git import Git
from git.exc import UnsafeProtocolError

SNAPSHOT_REFS = "refs/slotrunner/snapshots"
SNAPSHOT_KINDS = ("start", "end")
WORK_DIR = "work"
_JOB_ID_MAX_CHARS = 200
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_SCP_LIKE = re.compile(r"[^/]+:")  # git's rule: a colon before the first slash is host:path
_URL_SCHEMES = frozenset({"file", "http", "https", "ssh", "git", "git+ssh", "ssh+git"})
_NOT_NAME_SAFE = re.compile(r"[^A-Za-z0-9._-]+")

# Every git call runs with these, so a host with no global git config (or an exotic
# one: global excludes, autocrlf, hooks, signing) builds the same trees as any other.
_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # a worker has no terminal: fail, never wait for a password
    "GIT_AUTHOR_NAME": "slotrunner",
    "GIT_AUTHOR_EMAIL": "slotrunner@localhost",
    "GIT_COMMITTER_NAME": "slotrunner",
    "GIT_COMMITTER_EMAIL": "slotrunner@localhost",
}
_CONFIG = (
    *("-c", f"core.excludesFile={os.devnull}"),
    *("-c", "core.autocrlf=false"),
    *("-c", f"core.hooksPath={os.devnull}"),
    *("-c", "core.fsmonitor=false"),
    *("-c", "protocol.ext.allow=never"),
    *("-c", "advice.detachedHead=false"),
)


class WorkspaceError(Exception):
    """A work tree or snapshot operation failed; the message says what and why."""


@dataclass(frozen=True)
class Prepared:
    repo_key: str
    base_commit: str
    start_commit: str
    start_tree: str


@dataclass(frozen=True)
class _Source:
    spec: str  # what git clone is given
    key: str


@dataclass(frozen=True)
class _WorkTree:
    work: Path
    admin: Path  # <cache>/worktrees/<name>
    cache: Path

    def args(self) -> tuple[str, ...]:
        # Explicit --git-dir/--work-tree: if work/.git went missing, git must not walk
        # up and reset or clean whatever repository encloses $SLOTRUNNER_HOME.
        return ("--git-dir", str(self.admin), "--work-tree", str(self.work))

    def env(self) -> dict[str, str]:
        return {"GIT_INDEX_FILE": str(self.admin / "index")}


class Workspaces:
    def __init__(self, home: Path) -> None:
        # Resolved once: worktree back-pointers are compared as resolved paths, and a
        # symlinked home must not make every slot look like it belongs elsewhere.
        self.home = Path(home).resolve()
        self.repos_dir = self.home / "repos"
        self.slots_dir = self.home / "slots"
        self._git_cmd = Git()

    # ---- caches -------------------------------------------------------------------

    def cache_for(self, source: str) -> Path:
        src = _parse_source(source)
        with self._lock(self._cache_path(src)):
            return self._ensure_cache(src)[0]

    def _cache_path(self, src: _Source) -> Path:
        return self.repos_dir / f"{src.key}.git"

    @contextmanager
    def _lock(self, cache: Path) -> Iterator[None]:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache.with_suffix(".lock"))):
            yield

    def _ensure_cache(self, src: _Source) -> tuple[Path, bool]:
        """Clone the cache if missing (caller holds its lock); True when just cloned."""
        cache = self._cache_path(src)
        if (cache / "HEAD").is_file():
            return cache, False
        if cache.exists():
            # Never delete it ourselves: it may still hold snapshot refs worth saving.
            raise WorkspaceError(f"repo cache {cache} is damaged (no HEAD); move it aside")
        # Clone beside it and rename, so a crash mid-clone never leaves a half cache
        # that later jobs would take for a whole one.
        partial = cache.with_name(f".{cache.name}.partial")
        _rmtree(partial)
        self._git("clone", "--bare", "--quiet", "--", src.spec, str(partial), what="clone")
        for refspec in ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"):
            self._git("--git-dir", str(partial), "config", "--add", "remote.origin.fetch", refspec)
        partial.rename(cache)
        return cache, True

    def _resolve_base(self, cache: Path, source: str, base: str, fresh: bool) -> str:
        """The commit `base` names, fetching when it is not a commit the cache holds."""
        if not base or base.startswith("-") or any(c in base for c in "\x00\n\r"):
            raise WorkspaceError(f"base {base!r} is not a commit-ish")
        if _FULL_SHA.fullmatch(base) and (found := self._commit_of(cache, base)):
            return found  # a commit id never moves: no fetch needed
        # A branch or tag name may have moved in the source since the last fetch: ask.
        if not fresh:
            self._git("--git-dir", str(cache), "fetch", "-q", "--prune", "origin", what="fetch")
        if found := self._commit_of(cache, base):
            return found
        # Not on any branch or tag: a bare commit id or a ref such as refs/pull/1/head.
        status, _, _ = self._git(
            "--git-dir", str(cache), "fetch", "--quiet", "origin", base, check=False
        )
        found = self._commit_of(cache, "FETCH_HEAD") if status == 0 else None
        if found and (not _FULL_SHA.fullmatch(base) or found == base):
            return found
        raise WorkspaceError(f"unknown base {base!r}: no such commit, branch or tag in {source}")

    def _commit_of(self, git_dir: Path, rev: str) -> str | None:
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

    # ---- slot work trees -----------------------------------------------------------

    def prepare(self, slot_dir: Path, source: str, base: str, job_id: str) -> Prepared:
        check_job_id(job_id)
        src = _parse_source(source)
        cache = self._cache_path(src)
        work = Path(slot_dir).resolve() / WORK_DIR
        with self._lock(cache):
            cache, fresh = self._ensure_cache(src)
            base_commit = self._resolve_base(cache, source, base, fresh)
        tree, start_tree = self._recycle(work, cache, base_commit)
        commit = self._commit_snapshot(tree, job_id, "start", base_commit, start_tree)
        return Prepared(src.key, base_commit, commit, start_tree)

    def _recycle(self, work: Path, cache: Path, commit: str) -> tuple[_WorkTree, str]:
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
            _remove_nested_git(work)
            self._git(*tree.args(), "checkout", "-q", "--force", "--detach", commit, env=tree.env())
            self._git(*tree.args(), "clean", "-ffdxq", env=tree.env())
            start_tree = self._worktree_tree(tree)
            if start_tree == self._tree_of(cache, commit):
                return tree, start_tree
        except WorkspaceError:
            pass
        # A read-only directory left by a test run, a stale index.lock from a killed
        # git, or files git would not touch: start this slot's tree over, once.
        self._discard(work)
        tree = self._attach(work, cache, commit)
        self._reset(tree, commit)
        return tree, self._worktree_tree(tree)

    def _tree_of(self, git_dir: Path, commit: str) -> str | None:
        status, out, _ = self._git(
            "--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet",
            "--end-of-options", f"{commit}^{{tree}}", check=False,
        )  # fmt: skip
        return out.decode().strip() if status == 0 else None

    def _checkout(self, work: Path, cache: Path, commit: str) -> _WorkTree:
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

    def _attach(self, work: Path, cache: Path, commit: str) -> _WorkTree:
        tree = self._worktree_of(work)
        if tree is not None and tree.cache == cache:
            return tree
        self._discard(work)
        with self._lock(cache):
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
        tree = self._worktree_of(work)
        if tree is None:
            raise WorkspaceError(f"git worktree add did not make {work} a work tree")
        return tree

    def _reset(self, tree: _WorkTree, commit: str) -> None:
        _remove_nested_git(tree.work)
        self._git(*tree.args(), "checkout", "-q", "--force", "--detach", commit, env=tree.env())
        self._git(*tree.args(), "reset", "--quiet", "--hard", commit, env=tree.env())
        self._git(*tree.args(), "clean", "-ffdxq", env=tree.env())

    def _dirty(self, tree: _WorkTree) -> bool:
        _, out, _ = self._git(
            *tree.args(),
            "status",
            "--porcelain",
            "--ignored",
            "--untracked-files=all",
            env=tree.env(),
        )
        return bool(out.strip())

    def _worktree_of(self, work: Path) -> _WorkTree | None:
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
        if admin.parent.name != "worktrees" or cache.parent != self.repos_dir:
            return None
        if not back.is_file() or Path(back.read_text().strip()).resolve() != dotgit.resolve():
            return None
        return _WorkTree(work, admin, cache)

    def _discard(self, work: Path) -> None:
        """Remove `work`, deregistering it from its cache when it is a worktree of one."""
        tree = self._worktree_of(work)
        if tree is not None:
            with self._lock(tree.cache):
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
                _rmtree(work)  # when remove refused (submodules, permissions)
                self._git("--git-dir", str(tree.cache), "worktree", "prune")
        else:
            _rmtree(work)

    def _require_worktree(self, slot_dir: Path) -> _WorkTree:
        work = Path(slot_dir).resolve() / WORK_DIR
        tree = self._worktree_of(work)
        if tree is None:
            raise WorkspaceError(f"{work} is not a slotrunner work tree (prepare the slot first)")
        return tree

    # ---- snapshots -----------------------------------------------------------------

    def snapshot(self, slot_dir: Path, job_id: str, which: str) -> tuple[str, str]:
        check_job_id(job_id)
        _check_which(which)
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

    def _snapshot(self, tree: _WorkTree, job_id: str, which: str, parent: str) -> tuple[str, str]:
        tree_id = self._worktree_tree(tree)
        return self._commit_snapshot(tree, job_id, which, parent, tree_id), tree_id

    def _commit_snapshot(
        self, tree: _WorkTree, job_id: str, which: str, parent: str, tree_id: str
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

    def _worktree_tree(self, tree: _WorkTree) -> str:
        with tempfile.TemporaryDirectory(prefix="slotrunner-index-") as tmp:
            index = Path(tmp) / "index"
            real = tree.admin / "index"
            if real.is_file():
                # Seed with the tree's own index: tracked-but-ignored files stay tracked
                # and unchanged files are not re-hashed. copy2 keeps the index mtime, so
                # git's racy-clean check still re-hashes files changed in that second.
                shutil.copy2(real, index)
            env = {"GIT_INDEX_FILE": str(index)}
            self._git(*tree.args(), "add", "--all", env=env)
            _, out, _ = self._git(*tree.args(), "write-tree", env=env)
        return out.decode().strip()

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
        _check_which(which)
        found: list[tuple[int, Path, str, str]] = []
        for cache in sorted(self.repos_dir.glob("*.git")) if self.repos_dir.is_dir() else []:
            if (hit := self._ref_target(cache, snapshot_ref(job_id, which))) is not None:
                found.append((hit[2], cache, hit[0], hit[1]))
        if not found:
            return None
        # One job id used against two repos: the newest snapshot is the one meant.
        _, cache, commit, tree_id = max(found, key=lambda f: f[0])
        return cache, commit, tree_id

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

    # ---- git -----------------------------------------------------------------------

    def _git(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> tuple[int, bytes, str]:
        status, out, err = self._git_cmd.execute(
            [Git.GIT_PYTHON_GIT_EXECUTABLE or "git", *_CONFIG, *args],
            with_extended_output=True,
            with_exceptions=False,
            stdout_as_string=False,
            strip_newline_in_stdout=False,
            env={**_ENV, **(env or {})},
        )
        if check and status != 0:
            raise WorkspaceError(
                f"git {what or _verb(args)} failed (exit {status}): {err.strip() or '-'}"
            )
        return status, out, err


def _verb(args: tuple[str, ...]) -> str:
    """The git subcommand of `args`, past the global options and their paths."""
    rest = list(args)
    while rest and rest[0] in ("--git-dir", "--work-tree", "-C"):
        rest = rest[2:]
    return rest[0] if rest else "?"


def snapshot_ref(job_id: str, which: str) -> str:
    return f"{SNAPSHOT_REFS}/{job_id}/{which}"


def check_job_id(job_id: str) -> None:
    """Refuse a job id that cannot name ``refs/slotrunner/snapshots/<job_id>/...``."""
    problem = None
    if not isinstance(job_id, str) or not job_id:
        problem = "it is empty"
    elif len(job_id) > _JOB_ID_MAX_CHARS:
        problem = f"it is longer than {_JOB_ID_MAX_CHARS} characters"
    elif "/" in job_id:
        # job "a" owns refs .../a/start, so job "a/start" could never get its refs
        problem = "it contains '/'"
    elif any(ord(c) < 32 or ord(c) == 127 for c in job_id):
        problem = "it contains a control character"
    else:
        status, _, _ = Git().execute(
            [
                Git.GIT_PYTHON_GIT_EXECUTABLE or "git",
                "check-ref-format",
                snapshot_ref(job_id, "start"),
            ],
            with_extended_output=True,
            with_exceptions=False,
        )
        if status != 0:
            problem = "git refuses it in a ref name (no spaces, '..', '~^:?*[\\', '@{', .lock)"
    if problem:
        raise WorkspaceError(f"job id {job_id!r} cannot be used: {problem}")


def _check_which(which: str) -> None:
    if which not in SNAPSHOT_KINDS:
        raise WorkspaceError(f"snapshot {which!r}: expected one of {', '.join(SNAPSHOT_KINDS)}")


def _parse_source(source: str) -> _Source:
    text = source.strip() if isinstance(source, str) else ""
    if not text or text.startswith("-") or any(c in text for c in "\x00\n\r"):
        raise WorkspaceError(f"repo {source!r} is neither a path nor a URL")
    if "://" in text or _SCP_LIKE.match(text):
        scheme = urlsplit(text).scheme.lower() if "://" in text else "ssh"
        try:
            Git.check_unsafe_protocols(text)
        except UnsafeProtocolError:
            scheme = "ext"
        if scheme not in _URL_SCHEMES:
            raise WorkspaceError(
                f"repo URL {source!r}: scheme {scheme!r} not allowed "
                f"(use one of {', '.join(sorted(_URL_SCHEMES))})"
            )
        spec = text.rstrip("/")
        tail = [part for part in re.split(r"[/:]", spec) if part][-2:]
    else:
        path = Path(text).expanduser().resolve()
        if not path.exists():
            raise WorkspaceError(f"repo path {path} does not exist")
        if not (path / ".git").exists() and not (
            (path / "HEAD").is_file() and (path / "objects").is_dir()
        ):
            raise WorkspaceError(f"repo path {path} is not a git repository")
        spec = str(path)
        tail = [path.name]
    readable = "-".join(part.removesuffix(".git") for part in tail)
    readable = _NOT_NAME_SAFE.sub("-", readable).strip(".-")[:40] or "repo"
    return _Source(spec, f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}")


def _rmtree(path: Path) -> None:
    """Delete a tree even where code run in it took away write permission."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            child = os.path.join(root, name)
            if not os.path.islink(child):  # chmod follows links: never touch outside
                os.chmod(child, 0o700)
    shutil.rmtree(path)


def _remove_nested_git(work: Path) -> None:
    """Delete every ``.git`` below the work root (never the root's own ``.git`` file).

    Git never tracks such a path, but code run by ``run_tests`` can plant one, and a
    directory holding a ``.git`` looks like a nested repository to ``git clean`` and
    ``git add``: its files would survive the recycle into the next job's tree.
    """
    import shutil

    for dirpath, dirnames, filenames in os.walk(work):
        here = Path(dirpath)
        if here == work:
            dirnames[:] = [d for d in dirnames if d != ".git"]
            continue
        if ".git" in dirnames:
            dirnames.remove(".git")
            shutil.rmtree(here / ".git", ignore_errors=True)
        if ".git" in filenames:
            (here / ".git").unlink(missing_ok=True)
