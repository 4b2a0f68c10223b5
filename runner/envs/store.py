"""The environments of one host under ``$SLOTRUNNER_HOME/envs``: read, held, listed, evicted.

The layout is ``tools.sandbox.environment``'s (what the tool server shows a job);
beside the environments, ``envs/.locks/<key>.build`` (a filelock: one build at a
time, and no eviction during one) and ``envs/.locks/<key>.use`` (an ``flock``, held
shared by every running job of the key for its whole attempt, so an environment is
never evicted while a job uses one; the kernel drops it when a worker dies). The lock
files are never deleted: a process may hold one while another removes the
environment it guards.

Least-recently-used eviction (:meth:`EnvStore.evict`) runs after every build and
removes the environments used longest ago until the ones left fit in
``SLOTRUNNER_ENVS_MAX_GB``, skipping any in use or being built. ``last_used`` is the
time of a file touched every time a job takes the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from runner.core.durable import ensure_dir, fsync_dir, replace_file
from runner.core.poll import PollTimeout, poll_until
from runner.errors import RunnerError
from runner.workspace.fs import remove_tree
from tools.sandbox.environment import ENV_DIR, ENVS_DIR, KEY_PATTERN, META_FILE, env_root

LOG_FILE = "build.log"
FAILED_FILE = "failed.json"
LAST_USED_FILE = "last_used"
SOURCE_DIR = "src"  # the base's files during a build; removed after it
_LOCKS = ".locks"
GB = 1024**3
# How long a removal waits for a hold just let go. A hold is an flock on an open file
# description, and a process of the holder's that forks (a thread starting a sandbox
# zygote, a worker starting a job's process) shares that description until its child
# execs or closes it: for that instant the environment still reads as in use after
# the job let it go. A removal waits that out; a job's real hold lasts far longer.
RELEASE_GRACE_S = 0.5
_POLL_S = 0.01


class EnvError(RunnerError):
    """An environment cannot be keyed, built, used or removed; the message says why."""


class EnvBusy(EnvError):
    """The environment is being built or used by a running job: it cannot be removed."""


@dataclass(frozen=True)
class EnvInfo:
    """One environment as ``slotrunner envs list`` shows it."""

    key: str
    state: str  # ready | failed | building | incomplete
    path: Path
    size_bytes: int
    last_used: float | None
    in_use: bool
    meta: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "last_used": self.last_used,
            "in_use": self.in_use,
            "built_at": self.meta.get("built_at"),
            "build_s": self.meta.get("build_s"),
            "repo": self.meta.get("repo"),
            "base_commit": self.meta.get("base_commit"),
            "setup": self.meta.get("setup"),
            "error": self.meta.get("error"),
        }


class Held:
    """A running job's shared hold on an environment; :meth:`close` lets it go."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


def tree_bytes(path: Path) -> int:
    """Disk use of everything under ``path`` (allocated blocks, links not followed)."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


class EnvStore:
    """The environments under ``home/envs`` (module docstring), bounded by ``max_bytes``."""

    def __init__(self, home: Path, max_bytes: int | None = None) -> None:
        self.home = Path(home).resolve()
        self.dir = self.home / ENVS_DIR
        self.max_bytes = max_bytes

    # -- paths ----------------------------------------------------------------

    def root(self, key: str) -> Path:
        try:
            return env_root(self.home, key)
        except ValueError as exc:
            raise EnvError(str(exc)) from None

    def env_dir(self, key: str) -> Path:
        return self.root(key) / ENV_DIR

    def log_path(self, key: str) -> Path:
        return self.root(key) / LOG_FILE

    def _lock_path(self, key: str, kind: str) -> Path:
        self.root(key)  # checks the key
        locks = self.dir / _LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        return locks / f"{key}.{kind}"

    # -- state ----------------------------------------------------------------

    def meta(self, key: str) -> dict[str, Any] | None:
        """The environment's ``meta.json`` when it is good, else None."""
        return _read_json(self.root(key) / META_FILE)

    def failure(self, key: str) -> dict[str, Any] | None:
        return _read_json(self.root(key) / FAILED_FILE)

    def build_lock(self, key: str) -> FileLock:
        """Held for a whole build (and by a removal): one at a time per key."""
        return FileLock(str(self._lock_path(key, "build")))

    def reset(self, key: str) -> Path:
        """Empty the key's directory for a new build; the (empty) ``env/`` it made."""
        root = self.root(key)
        for name in (META_FILE, FAILED_FILE):
            (root / name).unlink(missing_ok=True)
        for name in (ENV_DIR, SOURCE_DIR):
            if (root / name).exists() or (root / name).is_symlink():
                remove_tree(root / name)
        (root / LOG_FILE).unlink(missing_ok=True)
        ensure_dir(root / ENV_DIR)
        return root / ENV_DIR

    def mark_ready(self, key: str, meta: dict[str, Any]) -> None:
        """Write ``meta.json`` durably: from here on the environment is good."""
        root = self.root(key)
        (root / FAILED_FILE).unlink(missing_ok=True)
        replace_file(root / META_FILE, json.dumps(meta, indent=1).encode())

    def mark_failed(self, key: str, record: dict[str, Any]) -> None:
        root = self.root(key)
        (root / META_FILE).unlink(missing_ok=True)
        replace_file(root / FAILED_FILE, json.dumps(record, indent=1).encode())

    def hold(self, key: str) -> Held:
        """A shared hold for a running job (caller holds the build lock); touches last use."""
        fd = os.open(self._lock_path(key, "use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        (self.root(key) / LAST_USED_FILE).touch()
        return Held(fd)

    @contextlib.contextmanager
    def _exclusive(self, key: str, wait_s: float = 0.0) -> Iterator[bool]:
        """Try the build lock and an exclusive use lock at once, for up to ``wait_s``:
        True when both are ours."""
        lock = self.build_lock(key)
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            yield False
            return
        fd = os.open(self._lock_path(key, "use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            yield _flock_within(fd, fcntl.LOCK_EX, wait_s)
        finally:
            os.close(fd)
            lock.release()

    # -- listing and removal --------------------------------------------------

    def keys(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.name for p in self.dir.iterdir() if KEY_PATTERN.fullmatch(p.name))

    def info(self, key: str) -> EnvInfo:
        root = self.root(key)
        meta, failed = self.meta(key), self.failure(key)
        with self._exclusive(key) as free:
            busy = not free
        if meta is not None:
            state = "ready"
        elif failed is not None:
            state, meta = "failed", failed
        else:
            state, meta = ("building" if busy else "incomplete"), {}
        try:
            last_used: float | None = (root / LAST_USED_FILE).stat().st_mtime
        except OSError:
            last_used = None
        size = meta.get("size_bytes") if state == "ready" else None
        return EnvInfo(
            key=key,
            state=state,
            path=root / ENV_DIR,
            size_bytes=int(size) if isinstance(size, int) else tree_bytes(root),
            last_used=last_used,
            in_use=busy and state == "ready",
            meta=meta,
        )

    def all(self) -> list[EnvInfo]:
        return [self.info(key) for key in self.keys()]

    def remove(self, key: str) -> None:
        """Delete one environment; :class:`EnvBusy` while it is built or used."""
        root = self.root(key)
        if not root.exists():
            raise EnvError(f"no environment {key} on this host ({self.dir})")
        with self._exclusive(key, wait_s=RELEASE_GRACE_S) as free:
            if not free:
                raise EnvBusy(f"environment {key} is being built or used by a running job")
            self._delete(root)

    def _delete(self, root: Path) -> None:
        # meta.json first: a crash half-way leaves an incomplete one, never a good one.
        (root / META_FILE).unlink(missing_ok=True)
        fsync_dir(root)
        remove_tree(root)

    def evict(self, keep: frozenset[str] = frozenset()) -> list[str]:
        """Remove least-recently-used environments until the rest fit ``max_bytes``."""
        if self.max_bytes is None:
            return []
        infos = self.all()
        total = sum(i.size_bytes for i in infos)
        removed: list[str] = []
        for info in sorted(infos, key=lambda i: i.last_used or 0.0):
            if total <= self.max_bytes:
                break
            if info.key in keep:
                continue
            with self._exclusive(info.key) as free:
                if not free:
                    continue
                self._delete(self.root(info.key))
            total -= info.size_bytes
            removed.append(info.key)
        return removed


def _flock_within(fd: int, operation: int, wait_s: float) -> bool:
    """``flock(fd, operation)`` without blocking, tried again until ``wait_s`` has passed."""

    def take() -> bool:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    try:
        return poll_until(take, wait_s, _POLL_S, what="the lock")
    except PollTimeout:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
