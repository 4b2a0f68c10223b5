"""A slot's lock: the one ``.lock`` file every change to a slot is made under.

The pool (lease, release, reclaim), the janitor, the runner's fenced writes and the
tool server (envelope check, then effect) all take this lock, so a slot can never
be recycled between a call's check and its effect. It lives in the plain core so the
tool server needs nothing of the Redis-backed pool to take it.

The lock is an exclusive ``flock`` on a descriptor opened for that one use, so two
threads of one process exclude each other as two processes do, and a process that
dies drops its lock with its descriptors. It is taken with ``fcntl`` directly, as the
receipt store takes its own (``tools/receipts/log.py``): ``filelock.FileLock`` took
about 300 us a use on this machine (against about 12 us), and every tool call takes
this lock once. Blocking waits are the kernel's (woken when the holder unlocks),
with no polling interval; only a bounded wait polls. A wait that runs out raises
``filelock.Timeout``, which the callers already catch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import Timeout

LOCK_FILE = ".lock"
POLL_S = 0.005  # between tries of a bounded wait

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def slot_lock(slot_dir: Path, timeout_s: float = -1) -> Iterator[None]:
    """Hold the slot's lock for the ``with`` block.

    ``timeout_s`` < 0 waits as long as it takes, 0 tries once, > 0 waits that long;
    a wait that runs out raises ``filelock.Timeout`` naming the lock file.
    """
    path = str(slot_dir / LOCK_FILE)
    fd = os.open(path, _FLAGS, 0o644)
    try:
        _acquire(fd, path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, path: str, timeout_s: float) -> None:
    if timeout_s < 0:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(path)
        time.sleep(min(POLL_S, left))
