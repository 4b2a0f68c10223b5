"""A job's local attempt high-water mark: the attempt numbers a Redis wipe cannot reissue.

``slotrunner:job:{id}:attempt`` lives only in Redis. A Redis that restarts without
its data forgets it, and the next claim of a job that is still running would issue
attempt 1 again: two live attempts sharing a number, so the fence by attempt number
(result commit, janitor, ``stop_reason``) can no longer tell them apart (I5). Slot
generations have the same problem and the same cure (``runner/slots/pool.py``): a local
durable stamp that only grows.

Layout, inside ``$SLOTRUNNER_HOME``::

    attempts/<job_id>          "<n>\\n": the highest attempt this host ever claimed
    attempts/.<job_id>.lock    filelock serializing one job's claims across processes

A claim holds the lock across read floor -> claim script (new attempt =
max(Redis counter, floor) + 1) -> durable write of the new attempt, so the file never
moves backwards and no attempt starts work before its number is on disk.

Limit: the floor is per host, like slot stamps. Across hosts the numbers stay unique
through the Redis counter plus each host's own floor; a wipe followed by a first claim
on a host that never ran the job can reissue a number another host used. Files are
never pruned: deleting one would reopen exactly the hole it closes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from runner.core.durable import Fsync, ensure_dir, os_fsync, replace_file
from runner.core.ids import valid_job_id
from runner.errors import RunnerError

ATTEMPTS_DIR = "attempts"
LOCK_TIMEOUT_S = 60.0


class AttemptFloorError(RunnerError):
    """The local attempt floor cannot be read, locked or made durable; the attempt must not run."""


def floor_path(home: Path, job_id: str) -> Path:
    """``$SLOTRUNNER_HOME/attempts/<job_id>``, refusing any id that could leave that directory."""
    if not valid_job_id(job_id):
        raise AttemptFloorError(f"job id {job_id!r} is not valid; no attempt floor for it")
    directory = home / ATTEMPTS_DIR
    path = directory / job_id
    if path.parent != directory:
        raise AttemptFloorError(f"job id {job_id!r} would leave {directory}")
    return path


def parse_floor(raw: bytes) -> int | None:
    """The attempt recorded in a floor file's bytes, or None when they are not one."""
    text = raw.decode("ascii", errors="replace").strip()
    if not text.isascii() or not text.isdigit():
        return None
    return int(text)


class AttemptFloor:
    """One job's attempt floor on this host."""

    def __init__(
        self,
        home: Path,
        job_id: str,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        *,
        fsync: Fsync = os_fsync,
    ) -> None:
        self.path = floor_path(home, job_id)
        self.lock_path = self.path.parent / f".{job_id}.lock"
        self.lock_timeout_s = lock_timeout_s
        self.fsync = fsync  # the seam a test fails the floor's writes through

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the job's floor lock (threads and processes of this host both exclude)."""
        self._ensure_dir()
        lock = FileLock(str(self.lock_path), timeout=self.lock_timeout_s, thread_local=False)
        try:
            lock.acquire()
        except Timeout as exc:
            raise AttemptFloorError(
                f"the attempt floor lock {self.lock_path} stayed held for "
                f"{self.lock_timeout_s:g} s; another claim of this job is stuck"
            ) from exc
        try:
            yield
        finally:
            lock.release()

    def read(self) -> int:
        """The highest attempt recorded here; 0 when this host never claimed the job."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise AttemptFloorError(f"cannot read the attempt floor {self.path}: {exc}") from exc
        value = parse_floor(raw)
        if value is None:
            # Fail closed: guessing 0 could reissue an attempt number that already ran.
            raise AttemptFloorError(
                f"the attempt floor {self.path} holds {raw[:40]!r}, not an attempt number"
            )
        return value

    def raise_to(self, attempt: int) -> None:
        """Record ``attempt`` durably unless a higher one is there; the caller holds the lock.

        Raises ``OSError`` (``DurabilityError`` for a failed fsync): the outcome is then
        unknown and the attempt must not start.
        """
        if attempt <= self.read():
            return
        replace_file(self.path, f"{attempt}\n".encode(), fsync=self.fsync)

    def _ensure_dir(self) -> None:
        directory = self.path.parent
        try:
            ensure_dir(directory, fsync=self.fsync)
        except OSError as exc:
            raise AttemptFloorError(
                f"cannot create the attempt floor directory {directory}: {exc}"
            ) from exc
