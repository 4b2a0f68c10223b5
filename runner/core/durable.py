"""The one audited place where slotrunner writes durably.

Two shapes only:

* :func:`replace_file` -- temp file, fsync, rename over the target, fsync the
  directory. Used for ``stamp.json`` and other small state files.
* :func:`append_record` -- one ``write`` of a whole line on an ``O_APPEND`` fd, made
  durable by the write itself (``RWF_DSYNC``) or by an fsync after it (and the
  directory fsync when the file was just created). Used for
  ``receipts.jsonl``. A writer that appends often keeps the descriptor open instead:
  :func:`open_append` once (it makes a new file's directory entry durable), then
  :func:`append_record_fd` per line -- the same write and fsync, without an ``open``
  and ``close`` per record. :func:`append_record` is exactly those two steps.

A failed fsync (or ``RWF_DSYNC`` write) is never retried: after an EIO the kernel may
already have dropped the dirty pages, so a second fsync can report success for data
that is gone (PostgreSQL's "fsyncgate"). Callers get :class:`DurabilityError` and must
treat the write's outcome as unknown.

Every function takes the ``fsync`` it calls (:data:`Fsync`; the real one,
:func:`os_fsync`, by default): the seam through which a test builds a writer whose
fsyncs fail (``ops.testing.faultplan``). With the real one an append is synced by its
own write, so a test process that takes over ``os.fsync`` itself takes over
``os.pwritev`` too (``FaultPlan.take_over_os_fsync``). Nothing here looks for a marker
or reads the environment.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from runner.core import heldcalls
from runner.errors import RunnerError

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
# Whether appends are written with RWF_DSYNC (Linux 4.7); turned off for the process
# the first time a file system refuses the flag with one of these, which the kernel
# returns before it writes anything.
_dsync_writes = hasattr(os, "RWF_DSYNC")
_DSYNC_REFUSED = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


class DurabilityError(RunnerError, OSError):
    """An fsync (or the write before it) failed; the record's fate is unknown."""


# An fsync: the descriptor, and the directory it is in (a file's directory, or the
# directory itself for a directory's own fsync). It raises OSError when it fails.
Fsync = Callable[[int, str], None]


def os_fsync(fd: int, directory: str) -> None:
    """The real fsync(2)."""
    os.fsync(fd)


def _fsync(fsync: Fsync, fd: int, directory: Path | str) -> None:
    where = os.fspath(directory)
    try:
        fsync(fd, where)
    except DurabilityError:
        raise
    except OSError as exc:
        raise DurabilityError(exc.errno, f"fsync failed in {where}: {exc.strerror}") from exc


def fsync_dir(directory: Path | str, *, fsync: Fsync = os_fsync) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fsync, fd, directory)
    finally:
        os.close(fd)


def ensure_dir(directory: Path, *, fsync: Fsync = os_fsync) -> None:
    """Create ``directory`` (and parents) unless it exists, its own entry made durable.

    Files written into a directory whose entry was never fsynced can vanish with it
    in a crash, however durably they were written themselves.
    """
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    fsync_dir(directory.parent, fsync=fsync)


def replace_file(path: Path, data: bytes, *, fsync: Fsync = os_fsync) -> None:
    """Atomically replace ``path`` with ``data``; durable when this returns."""
    directory = path.parent
    tmp = directory / f".{path.name}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        _fsync(fsync, fd, directory)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory, fsync=fsync)


def open_append(path: Path, *, fsync: Fsync = os_fsync) -> int:
    """An ``O_APPEND`` descriptor on ``path``, creating the file when it is absent.

    A file this call creates has its directory entry fsynced before the descriptor is
    returned, so no record appended through it can outlive a crash while its file
    does not. ``O_EXCL`` tells creation apart from a race with another creator.
    """
    try:
        fd = os.open(path, _APPEND_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(path, _APPEND_FLAGS)
    try:
        fsync_dir(path.parent, fsync=fsync)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_record_fd(
    fd: int, line: bytes, directory: Path | str, *, fsync: Fsync = os_fsync
) -> int:
    """Append one whole line to the ``O_APPEND`` descriptor ``fd``; durable when this returns.

    ``directory`` is the file's directory (named in errors, and passed to ``fsync``).
    Returns the file offset just past the line: the caller can tell whether its line
    is the last one without reading the file back.

    With the real fsync (the default) the line is written with ``RWF_DSYNC``: the
    write returns once its bytes and the file's new size are on disk, as ``write`` +
    ``fdatasync`` would leave them, in one system call instead of two (a tool call
    writes two records, and in a threaded server each system call is also a hand-off
    of the interpreter lock). A file system that refuses the flag gets ``write`` +
    ``fsync`` from then on. Any other ``fsync`` (a test's seam) is called after a plain
    ``write``.
    """
    global _dsync_writes
    if not line.endswith(b"\n"):
        raise ValueError("a record must be one whole line ending in a newline")
    if fsync is os_fsync and _dsync_writes:
        try:
            written = os.pwritev(fd, (line,), -1, os.RWF_DSYNC)
        except OSError as exc:
            if exc.errno not in _DSYNC_REFUSED:
                where = os.fspath(directory)
                raise DurabilityError(
                    exc.errno, f"durable append failed in {where}: {exc.strerror}"
                ) from exc
            _dsync_writes = False  # refused before a byte was written: fall back
        else:
            _check_whole(written, line, directory)
            return heldcalls.tell(fd)
    _check_whole(os.write(fd, line), line, directory)
    _fsync(fsync, fd, directory)
    return heldcalls.tell(fd)


def synced_appends() -> bool:
    """Whether this process's appends are synced by their own write (``RWF_DSYNC``): false
    where the flag is missing or a file system refused it."""
    return _dsync_writes


def _check_whole(written: int, line: bytes, directory: Path | str) -> None:
    if written != len(line):
        raise DurabilityError(5, f"short append in {directory}: {written} of {len(line)} bytes")


def append_record(path: Path, line: bytes, *, fsync: Fsync = os_fsync) -> None:
    """Append one whole line (``line`` must end with a newline); durable when this returns."""
    if not line.endswith(b"\n"):
        raise ValueError("a record must be one whole line ending in a newline")
    fd = open_append(path, fsync=fsync)
    try:
        append_record_fd(fd, line, path.parent, fsync=fsync)
    finally:
        os.close(fd)
