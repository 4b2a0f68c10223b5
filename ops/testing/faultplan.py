"""Faults armed at run time in a test's own processes, through one directory.

The directory's path is given on the command line of a test-only entry point
(``python -m ops.testing.toolserver --faults DIR``, ``python -m ops.testing.worker
--faults DIR``); a normally started ``slotrunner toolserver`` or worker never hears
of it, so nothing here can reach production. A test (or the chaos campaign) arms and
disarms faults by writing and removing files in it while the process runs; the
process reads them at the points where the faults apply:

    DIR/eio/<digest of a directory>   while it exists, every fsync in that directory
                                      fails with EIO (the file holds the directory)
    DIR/crash.json                    the next mutating call that matches it (its
                                      tool, and a text its key contains) removes it,
                                      then SIGKILLs the process after the effect,
                                      before the outcome is recorded

Each file is created whole (written aside, then renamed in), so a reader never sees
half of one; a crash is consumed by removing its file, so it fires once even when
calls race for it, and the restarted process does not crash again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from tools.server.seams import CallHooks

if TYPE_CHECKING:
    from _typeshed import HasFileno, ReadableBuffer, SupportsLenAndGetItem

_EIO_DIR = "eio"
_CRASH_FILE = "crash.json"


def _where(directory: Path | str) -> str:
    return os.path.realpath(os.fspath(directory))


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class FaultPlan(CallHooks):
    """One fault directory, seen by the test that arms it and the process that obeys it.

    As a process's seams: :meth:`fsync` is its fsync (``runner.core.durable.Fsync``),
    and the plan itself is its call hooks (:meth:`after_effect`).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / _EIO_DIR).mkdir(parents=True, exist_ok=True)

    # -- EIO on fsync -------------------------------------------------------------

    def _eio_flag(self, directory: Path | str) -> Path:
        where = _where(directory)
        digest = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return self.root / _EIO_DIR / digest

    def arm_fsync_eio(self, directory: Path | str) -> None:
        """From now on every fsync of a file in ``directory`` (or of it) fails with EIO."""
        _write_whole(self._eio_flag(directory), _where(directory))

    def disarm_fsync_eio(self, directory: Path | str) -> None:
        self._eio_flag(directory).unlink(missing_ok=True)

    def fsync(self, fd: int, directory: str) -> None:
        """The process's fsync: EIO while ``directory`` is armed, the real one otherwise."""
        if self._eio_flag(directory).exists():
            raise OSError(errno.EIO, f"injected EIO on fsync in {directory}")
        os.fsync(fd)

    def take_over_os_fsync(self) -> None:
        """Make this whole process's ``os.fsync`` obey the plan (EIO in armed directories),
        and its ``os.pwritev`` with ``RWF_DSYNC`` (a durable append syncs in its own
        write, ``runner.core.durable``): in an armed directory the bytes are written,
        as a real failed sync leaves them in the page cache, and the call fails EIO.

        For the test worker (``ops.testing.worker``): the runner's writers there are
        built deep inside a job (the attempt floor of each claim), so the plan is put
        at the system-call boundary of that process instead of into each writer. The
        directory of a descriptor is read from ``/proc/self/fd``.
        """
        real_fsync, real_pwritev = os.fsync, os.pwritev

        def armed(number: int) -> str | None:
            try:
                path = os.readlink(f"/proc/self/fd/{number}")
            except OSError:
                path = ""
            directory = path if os.path.isdir(path) else os.path.dirname(path)
            return directory if directory and self._eio_flag(directory).exists() else None

        def fsync(fd: int | HasFileno) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            directory = armed(number)
            if directory is not None:
                raise OSError(errno.EIO, f"injected EIO on fsync in {directory}")
            real_fsync(fd)

        def pwritev(
            fd: int, buffers: SupportsLenAndGetItem[ReadableBuffer], offset: int, flags: int = 0
        ) -> int:
            directory = armed(fd) if flags & os.RWF_DSYNC else None
            if directory is None:
                return real_pwritev(fd, buffers, offset, flags)
            real_pwritev(fd, buffers, offset, flags & ~os.RWF_DSYNC)
            raise OSError(errno.EIO, f"injected EIO on a synced write in {directory}")

        os.fsync = fsync
        os.pwritev = pwritev

    # -- a crash after the effect -------------------------------------------------

    @property
    def _crash(self) -> Path:
        return self.root / _CRASH_FILE

    def arm_crash(self, *, key_contains: str = "", tool: str | None = None) -> None:
        """SIGKILL after the effect of the next mutating call of ``tool`` (any tool when
        None) whose idempotency key contains ``key_contains`` (any key when empty)."""
        _write_whole(self._crash, json.dumps({"key_contains": key_contains, "tool": tool}))

    def crash_armed(self) -> bool:
        return self._crash.exists()

    def disarm_crash(self) -> None:
        self._crash.unlink(missing_ok=True)

    def after_effect(self, tool: str, key: str) -> None:
        try:
            wanted = json.loads(self._crash.read_text())
        except (OSError, ValueError):
            return  # not armed: the usual case, one failed open per mutating call
        if (
            wanted.get("tool") not in (None, tool)
            or str(wanted.get("key_contains") or "") not in key
        ):
            return
        try:
            # Consumed before the kill, so the restarted process does not crash again.
            self._crash.unlink()
        except FileNotFoundError:
            return  # another call consumed it first
        with contextlib.suppress(ProcessLookupError):
            os.kill(os.getpid(), signal.SIGKILL)
