"""A slot's lock: the one ``.lock`` file every change to a slot is made under.

The pool (lease, release, reclaim), the janitor, the runner's fenced writes and the
tool server (envelope check, then effect) all take this lock, so a slot can never
be recycled between a call's check and its effect. It lives in the plain core so the
tool server needs nothing of the Redis-backed pool to take it.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

LOCK_FILE = ".lock"


def slot_lock(slot_dir: Path, timeout_s: float = -1) -> FileLock:
    """The slot's lock; a new object per use so threads and processes both exclude."""
    return FileLock(str(slot_dir / LOCK_FILE), timeout=timeout_s, thread_local=False)
