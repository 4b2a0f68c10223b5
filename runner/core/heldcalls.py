"""Cheap system calls made without letting go of the interpreter lock.

CPython releases the interpreter lock around every ``os`` and ``fcntl`` system call,
even one that returns in a microsecond. In a threaded server, each release is a
hand-off: the threads waiting for the lock are woken, race for it, and the caller
queues behind them to get it back. A receipt record (docs/architecture.md §Receipts)
makes five such calls (``flock``, ``stat``, the synced write, ``lseek``, unlock) of
which only the synced write waits on the device; with eight slots writing at once, the
other four hand-offs cost more than the records (``bench/`` receipts, eight slots).

This module makes those four calls through :class:`ctypes.PyDLL`, which keeps the
interpreter lock across the call: a non-blocking ``flock`` (a lock another process
holds is waited for with :func:`fcntl.flock`, which does let go), its unlock,
``statx`` of a path and ``lseek``. Where the C library lacks one of them (not Linux,
an old glibc), every function here is the plain ``os``/``fcntl`` call instead.
Nothing here may block: a call that can wait on another process or the device does
not belong in this module.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from typing import NamedTuple


class FileState(NamedTuple):
    """What the receipt store needs of a ``stat``: the file's identity and size."""

    dev: int
    ino: int
    size: int


# struct statx (linux/stat.h): the same layout on every architecture.
class _StatxTimestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_r", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    _fields_ = [
        ("stx_mask", ctypes.c_uint32),
        ("stx_blksize", ctypes.c_uint32),
        ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32),
        ("stx_uid", ctypes.c_uint32),
        ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16),
        ("_spare0", ctypes.c_uint16),
        ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64),
        ("stx_blocks", ctypes.c_uint64),
        ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _StatxTimestamp),
        ("stx_btime", _StatxTimestamp),
        ("stx_ctime", _StatxTimestamp),
        ("stx_mtime", _StatxTimestamp),
        ("stx_rdev_major", ctypes.c_uint32),
        ("stx_rdev_minor", ctypes.c_uint32),
        ("stx_dev_major", ctypes.c_uint32),
        ("stx_dev_minor", ctypes.c_uint32),
        ("_spare2", ctypes.c_uint64 * 14),
    ]


_AT_FDCWD = -100
_STATX_INO_SIZE = 0x100 | 0x200  # STATX_INO | STATX_SIZE


def _load() -> ctypes.PyDLL | None:
    # No argtypes: ctypes converting each argument through them costs more than the
    # call. Every argument below is passed as what the C signature takes (an int, a
    # bytes path, a pointer, and the one 64-bit offset as c_int64).
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        for name in ("flock", "lseek", "statx"):
            getattr(libc, name)
        libc.lseek.restype = ctypes.c_int64
    except (OSError, AttributeError):  # no C library to load, or a symbol missing
        return None
    return libc


_ZERO_OFFSET = ctypes.c_int64(0)
_LIBC = _load()


def _error(path: str | None = None) -> OSError:
    """The failed call's errno as an ``OSError`` (its subclass for the errno, e.g.
    :class:`FileNotFoundError`), naming ``path`` when there is one."""
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), path)


def held() -> bool:
    """Whether the calls here keep the interpreter lock (else they are the ``os`` ones)."""
    return _LIBC is not None


def lock_exclusive(fd: int) -> None:
    """``flock(fd, LOCK_EX)``: at once, the interpreter lock kept, when nobody holds the
    lock; else a blocking wait that lets other threads run."""
    if _LIBC is not None:
        if _LIBC.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) == 0:
            return
        if ctypes.get_errno() not in (errno.EWOULDBLOCK, errno.EINTR):
            raise _error()
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    """``flock(fd, LOCK_UN)``."""
    if _LIBC is None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    elif _LIBC.flock(fd, fcntl.LOCK_UN) != 0:
        raise _error()


def tell(fd: int) -> int:
    """The descriptor's file offset (``lseek(fd, 0, SEEK_CUR)``)."""
    if _LIBC is None:
        return os.lseek(fd, 0, os.SEEK_CUR)
    offset: int = _LIBC.lseek(fd, _ZERO_OFFSET, os.SEEK_CUR)
    if offset < 0:
        raise _error()
    return offset


class PathWatch:
    """``stat`` of one path, again and again: the path encoded and the result buffer made
    once. Not for two threads at once (the receipt store calls it under its lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._encoded = os.fsencode(path)
        self._buf = _Statx()
        self._ref = ctypes.byref(self._buf)

    def state(self) -> FileState:
        """Identity and size of the file now at the path, as :func:`os.stat` would
        give them (symlinks followed); raises :class:`FileNotFoundError` and the other
        :class:`OSError` subclasses as :func:`os.stat` does."""
        if _LIBC is None:
            st = os.stat(self.path)
            return FileState(st.st_dev, st.st_ino, st.st_size)
        buf = self._buf
        if _LIBC.statx(_AT_FDCWD, self._encoded, 0, _STATX_INO_SIZE, self._ref) != 0:
            raise _error(self.path)
        return FileState(
            os.makedev(buf.stx_dev_major, buf.stx_dev_minor), buf.stx_ino, buf.stx_size
        )
