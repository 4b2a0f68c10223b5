"""Killing a command's tree without a pids cgroup: the kill returns once the group is dead."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from tools.sandbox.process import _kill_tree, group_alive

# A group leader that starts a second member of its group, says so, and waits.
_FAMILY = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def _family() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAMILY], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


@pytest.mark.timeout(60)
def test_a_group_with_a_live_member_is_alive_and_its_zombies_are_not() -> None:
    """Both members alive: the group is. Both killed and the leader left unreaped (a
    zombie, as drive() leaves it until the end): the group is dead."""
    proc = _family()
    try:
        assert group_alive(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, unreaped
        # The second member is the leader's child: reparented and reaped by the host.
        _kill_tree(proc, None)
        assert not group_alive(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(60)
def test_the_kill_without_a_cgroup_returns_once_no_member_is_alive() -> None:
    """The stopped member gets its SIGKILL only when the kernel runs it; _kill_tree does
    not return before then, so nothing of the group outlives the call."""
    proc = _family()
    try:
        os.killpg(proc.pid, signal.SIGSTOP)  # every member stopped, as under heavy load
        _kill_tree(proc, None)
        assert not group_alive(proc.pid)
    finally:
        proc.wait()
