"""The one audited place where slotrunner writes durably.

Two shapes only:

* :func:`replace_file` -- temp file, fsync, rename over the target, fsync the
  directory. Used for ``stamp.json`` and other small state files.
* :func:`append_record` -- one ``write`` of a whole line on an ``O_APPEND`` fd, then
  fsync (and the directory fsync when the file was just created). Used for
  ``receipts.jsonl``.

A failed fsync is never retried: after an EIO the kernel may already have dropped the
dirty pages, so a second fsync can report success for data that is gone
(PostgreSQL's "fsyncgate"). Callers get :class:`DurabilityError` and must treat the
write's outcome as unknown.
"""

from __future__ import annotations

import os
from pathlib import Path

# Fault injection for tests: when this file exists in a directory, every fsync of a
# file in that directory fails with EIO. It is a file (not an env var) so a test can
# switch it on for one running server and one slot without restarting anything.
FAIL_FSYNC_MARKER = ".fail-fsync"


class DurabilityError(OSError):
    """An fsync (or the write before it) failed; the record's fate is unknown."""


def _fsync(fd: int, directory: Path) -> None:
    if (directory / FAIL_FSYNC_MARKER).exists():
        raise DurabilityError(5, f"injected EIO on fsync in {directory}")
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(exc.errno, f"fsync failed in {directory}: {exc.strerror}") from exc


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fd, directory)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``; durable when this returns."""
    directory = path.parent
    tmp = directory / f".{path.name}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        _fsync(fd, directory)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def append_record(path: Path, line: bytes) -> None:
    """Append one whole line (``line`` must end with a newline); durable when this returns."""
    if not line.endswith(b"\n"):
        raise ValueError("a record must be one whole line ending in a newline")
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise DurabilityError(5, f"short append to {path}: {written} of {len(line)} bytes")
        _fsync(fd, path.parent)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)
