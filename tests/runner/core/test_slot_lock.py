"""The slot's lock (runner/core/slot_lock.py): one holder at a time across threads and
processes, bounded waits that run out as ``filelock.Timeout``, and a holder that dies
(SIGKILL) leaves the lock free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from filelock import Timeout

from runner.core.slot_lock import LOCK_FILE, slot_lock

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from runner.core.slot_lock import slot_lock\n"
    "with slot_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


def holder(slot_dir: Path) -> subprocess.Popen[str]:
    """Another process holding the slot's lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(slot_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_another_process_holding_it_makes_a_bounded_wait_run_out(tmp_path: Path) -> None:
    proc = holder(tmp_path)
    try:
        for timeout_s in (0, 0.2):
            with pytest.raises(Timeout) as err, slot_lock(tmp_path, timeout_s=timeout_s):
                pytest.fail("the lock was taken while another process held it")
            assert str(tmp_path / LOCK_FILE) in str(err.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_killed_with_sigkill_leaves_the_lock_free(tmp_path: Path) -> None:
    proc = holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with slot_lock(tmp_path, timeout_s=0):
        pass


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with slot_lock(tmp_path):
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(30)
        with pytest.raises(Timeout), slot_lock(tmp_path, timeout_s=0):
            pytest.fail("two threads held the lock at once")
    finally:
        release.set()
        thread.join(30)
    with slot_lock(tmp_path, timeout_s=0):
        pass


def test_a_blocking_wait_gets_the_lock_once_the_holder_lets_go(tmp_path: Path) -> None:
    order: list[str] = []
    taken = threading.Event()

    def hold_then_let_go() -> None:
        with slot_lock(tmp_path):
            taken.set()
            order.append("holder in")
            # The main thread is blocked on the lock by now or soon; either way it
            # may only get in after this block ends.
            threading.Event().wait(0.3)
            order.append("holder out")

    thread = threading.Thread(target=hold_then_let_go)
    thread.start()
    assert taken.wait(30)
    with slot_lock(tmp_path):
        order.append("waiter in")
    thread.join(30)
    assert order == ["holder in", "holder out", "waiter in"]


def test_a_lock_file_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    slot_dir = tmp_path / "slot"
    slot_dir.mkdir()
    (slot_dir / LOCK_FILE).symlink_to(target)
    with pytest.raises(OSError), slot_lock(slot_dir):
        pytest.fail("the lock followed a symlink")
    assert not target.exists()
