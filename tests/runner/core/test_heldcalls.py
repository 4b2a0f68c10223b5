"""The cheap system calls the receipt store makes without letting go of the interpreter
lock (runner/core/heldcalls.py): same answers as the ``os`` calls, the same errors,
and a lock another process holds is waited for without stopping the other threads."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from runner.core import heldcalls

# Where the C library lacks flock, lseek or statx, the os calls are all there is.
MODES = ["held", "os"] if heldcalls.held() else ["os"]


@pytest.fixture(params=MODES)
def calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the C library's calls and on the plain ``os`` fallback."""
    if request.param == "os":
        monkeypatch.setattr(heldcalls, "_LIBC", None)
    return str(request.param)


def test_state_matches_os_stat(tmp_path: Path, calls: str) -> None:
    path = tmp_path / "receipts.jsonl"
    path.write_bytes(b"x" * 1234)
    st = os.stat(path)
    assert heldcalls.PathWatch(str(path)).state() == (st.st_dev, st.st_ino, 1234)


def test_state_of_a_missing_file_is_file_not_found(tmp_path: Path, calls: str) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        heldcalls.PathWatch(str(tmp_path / "absent")).state()
    assert caught.value.filename == str(tmp_path / "absent")


def test_state_names_other_errors(tmp_path: Path, calls: str) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        heldcalls.PathWatch(str(tmp_path / "file" / "below")).state()


def test_tell_reads_offsets_past_four_gib(tmp_path: Path, calls: str) -> None:
    fd = os.open(tmp_path / "sparse", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.lseek(fd, 5 * 2**30 + 7, os.SEEK_SET)  # no bytes written: a sparse offset
        assert heldcalls.tell(fd) == 5 * 2**30 + 7
    finally:
        os.close(fd)


def test_tell_of_a_closed_descriptor_raises(tmp_path: Path, calls: str) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.close(fd)
    with pytest.raises(OSError) as caught:
        heldcalls.tell(fd)
    assert caught.value.errno == errno.EBADF


def test_lock_and_unlock_exclude_another_process(tmp_path: Path, calls: str) -> None:
    lock = tmp_path / "receipts.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        heldcalls.lock_exclusive(fd)
        other = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # a second open file description
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            heldcalls.unlock(fd)
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
        finally:
            os.close(other)
    finally:
        os.close(fd)


def _hold_lock(path: str, locked: Event, release: float) -> None:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    locked.set()
    time.sleep(release)
    fcntl.flock(fd, fcntl.LOCK_UN)


def test_a_lock_held_elsewhere_is_waited_for_without_stopping_other_threads(
    tmp_path: Path, calls: str
) -> None:
    """The kept interpreter lock is only for a lock that is free: while another process
    holds it, the waiting thread lets the rest of the process run."""
    lock = tmp_path / "receipts.lock"
    lock.write_bytes(b"")
    # spawned: a forked multiprocessing child would run the after-fork handlers of
    # whatever this test process imported before (kombu's can hang: ops/detect/prefetch.py)
    ctx = multiprocessing.get_context("spawn")
    locked = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(lock), locked, 1.5))
    holder.start()
    try:
        assert locked.wait(30)
        fd = os.open(lock, os.O_RDWR)
        got = threading.Event()

        def take() -> None:
            heldcalls.lock_exclusive(fd)
            got.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        ticks = 0
        while not got.is_set() and holder.is_alive():
            ticks += 1  # runs only while the waiter has let go of the interpreter lock
            time.sleep(0.01)
        holder.join(30)
        assert got.wait(30), "the lock was never taken after its holder let go"
        assert ticks >= 10, f"the main thread ran {ticks} times while the lock was held elsewhere"
        heldcalls.unlock(fd)
        os.close(fd)
    finally:
        holder.kill()
        holder.join()


def test_a_path_watch_sees_the_file_now_at_its_path(tmp_path: Path, calls: str) -> None:
    """The buffer is reused, the answer is not: a growth, a replacement and a removal
    of the file are each seen on the next call."""
    path = tmp_path / "receipts.jsonl"
    path.write_bytes(b"a\n")
    watch = heldcalls.PathWatch(str(path))
    first = watch.state()
    assert first.size == 2
    with path.open("ab") as f:
        f.write(b"bc\n")
    assert watch.state() == (first.dev, first.ino, 5)
    (tmp_path / "new").write_bytes(b"")
    os.replace(tmp_path / "new", path)
    assert watch.state() == (first.dev, os.stat(path).st_ino, 0)
    assert watch.state().ino != first.ino
    path.unlink()
    with pytest.raises(FileNotFoundError):
        watch.state()
