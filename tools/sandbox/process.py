"""Spawning one contained command: its limits, bounded output, deadline and kill.

The command runs behind ``prlimit`` or a tiny shim that sets the rlimits and ``exec``s
it (``tools/sandbox/shim.py``); both pipes are read incrementally, each stream kept to
``output_bytes``; a wall-clock deadline, and the command's own exit, kill its process
group and pids cgroup. With
``merged`` (the ``exec`` tool) stdout and stderr are one pipe, so the output keeps the
order the command wrote it in, and the kept part is its head and its tail.
:func:`execute_in` runs a bubblewrap command as a zygote that joined its cgroup ahead
of the call (``tools/sandbox/zygote.py``); both end in :func:`drive`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.core.poll import PollTimeout, poll_until
from tools.sandbox.cgroup import GRACE_S, POLL_S, PidsCgroup
from tools.sandbox.policy import Limits, rlimits
from tools.sandbox.shim import capped, child_argv, find_prlimit
from tools.sandbox.zygote import Zygote

_READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    truncated: bool


class _Capture:
    """One stream's bytes, at most ``limit`` of them kept: the head, and with ``tail`` the
    last part as well (the middle is dropped and counted, and a marker says so)."""

    def __init__(self, limit: int, tail: bool) -> None:
        self.tail_room = limit // 2 if tail else 0
        self.head_room = limit - self.tail_room
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        take = max(self.head_room - len(self.head), 0)
        self.head += chunk[:take]
        rest = chunk[take:]
        if not rest:
            return
        if not self.tail_room:
            self.dropped += len(rest)
            return
        self.tail += rest
        over = len(self.tail) - self.tail_room
        if over > 0:
            del self.tail[:over]
            self.dropped += over

    def data(self) -> bytes:
        if not self.dropped or not self.tail_room:
            return bytes(self.head + self.tail)
        marker = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


def _exited(pid: int) -> bool:
    """Has the child exited? Without reaping it, so its pid cannot be reused meanwhile."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_tree(proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # our child leads its own session and group
    if cgroup is not None:
        cgroup.kill_all()  # returns once the cgroup is empty
        return
    # Without a cgroup, wait for the group to be dead as well: a SIGKILL is delivered
    # when its target next runs. bwrap's own init is in the group, and bwrap exits as
    # soon as that init reports the command's exit, before the init has taken the rest
    # of its PID namespace down (a setsid leaver there is in no group of ours). The
    # namespace is gone once its init is dead.
    with contextlib.suppress(PollTimeout):
        poll_until(lambda: not group_alive(proc.pid), GRACE_S, POLL_S)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still alive (a zombie is dead: it is only
    waiting to be reaped)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                return True
    return False


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def execute(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    cgroup: PidsCgroup | None,
    *,
    merged: bool = False,
) -> Outcome:
    """Run ``command`` (bounded, killed with everything it started); with ``merged`` its
    stderr goes into its stdout pipe and ``Outcome.stderr`` is empty."""
    procs = str(cgroup.procs_file) if cgroup is not None else None
    argv = child_argv(command, rlimits(limits, cgroup is None), procs, find_prlimit())
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        start_new_session=True,
    )
    return drive(proc, limits, cgroup, merged=merged)


def execute_in(zygote: Zygote, command: Sequence[str], limits: Limits) -> Outcome | None:
    """Run ``command`` as ``zygote`` (``tools/sandbox/zygote.py``: already in its cgroup),
    as :func:`execute` would, its cgroup removed after; None when the zygote cannot be
    used (discarded: nothing ran)."""
    if not zygote.start(command, capped(rlimits(limits, False)), limits.processes):
        zygote.discard()
        return None
    try:
        return drive(zygote.proc, limits, zygote.cgroup, merged=zygote.proc.stderr is None)
    finally:
        zygote.cgroup.remove()


def drive(
    proc: subprocess.Popen[bytes], limits: Limits, cgroup: PidsCgroup | None, *, merged: bool
) -> Outcome:
    """Pump a started child's pipes to its end, to the deadline, then kill what is left."""
    assert proc.stdout is not None
    streams = [proc.stdout] if proc.stderr is None else [proc.stdout, proc.stderr]
    buffers = {s.fileno(): _Capture(limits.output_bytes, tail=merged) for s in streams}
    timed_out = killed = False
    deadline = time.monotonic() + limits.wall_s
    pidfd = os.pidfd_open(proc.pid)  # readable once the child exits: no polling
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(pidfd, selectors.EVENT_READ)
            for fd in buffers:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            exited = False
            while True:
                if not exited and _exited(proc.pid):
                    exited = True
                    sel.unregister(pidfd)
                    if not killed:
                        # What it left running in the background may still hold our pipes.
                        _kill_tree(proc, cgroup)
                        killed, deadline = True, min(deadline, time.monotonic() + GRACE_S)
                if exited and not sel.get_map():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if killed:
                        break  # a process we cannot kill holds a pipe: stop reading
                    timed_out = killed = True
                    _kill_tree(proc, cgroup)
                    deadline = time.monotonic() + GRACE_S
                    continue
                for key, _ in sel.select(remaining):
                    fd = int(key.fd)
                    if fd == pidfd:
                        continue
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    buffers[fd].add(chunk)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        _kill_tree(proc, cgroup)  # before reaping, while its group id cannot be reused
        returncode = proc.wait()
    finally:
        if proc.returncode is None:  # interrupted: never leave the command running
            _kill_tree(proc, cgroup)
            proc.wait()
        os.close(pidfd)
        for stream in streams:
            stream.close()
    out, *err = (capture.data() for capture in buffers.values())
    truncated = any(capture.dropped for capture in buffers.values())
    return Outcome(returncode, timed_out, out, err[0] if err else b"", truncated)
