"""Spawning one contained command: the rlimit shim, bounded output, deadline and kill.

The command runs behind a tiny Python shim that sets the rlimits and ``exec``s it
(no ``preexec_fn``, which can deadlock a threaded server between fork and exec);
both pipes are read incrementally, each stream kept to ``output_bytes``; a wall-clock
deadline, and the command's own exit, kill its process group and pids cgroup.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.sandbox.cgroup import GRACE_S, PidsCgroup
from tools.sandbox.policy import Limits, rlimits

_READ_CHUNK = 64 * 1024

# Python ignores SIGPIPE and SIGXFSZ at startup and ignored signals survive exec, so
# the shim restores them: a command past its file-size limit must die, as anywhere else.
_SHIM = """\
import os, resource, signal, sys
procs, spec, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
try:
    if procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    for row in filter(None, spec.split(",")):
        name, soft, hard = row.split(":")
        res = getattr(resource, name)
        cap = resource.getrlimit(res)[1]
        soft, hard = int(soft), int(hard)
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        resource.setrlimit(res, (soft, hard))
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot apply limits: %s\\n" % e)
    os._exit(126)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot execute %r: %s\\n" % (argv[0], e))
    os._exit(127)
"""


@dataclass(frozen=True)
class Outcome:
    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    truncated: bool


def _exited(pid: int) -> bool:
    """Has the child exited? Without reaping it, so its pid cannot be reused meanwhile."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_tree(proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # our child leads its own session and group
    if cgroup is not None:
        cgroup.kill_all()


def execute(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    cgroup: PidsCgroup | None,
) -> Outcome:
    spec = ",".join(f"{n}:{s}:{h}" for n, s, h in rlimits(limits, cgroup is None))
    procs = str(cgroup.procs_file) if cgroup is not None else ""
    shim = [sys.executable, "-I", "-S", "-c", _SHIM, procs, spec, *command]
    proc = subprocess.Popen(
        shim,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = timed_out = killed = False
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
                    room = limits.output_bytes - len(buffers[fd])
                    truncated = truncated or len(chunk) > room
                    buffers[fd] += chunk[: max(room, 0)]
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        _kill_tree(proc, cgroup)  # before reaping, while its group id cannot be reused
        returncode = proc.wait()
    finally:
        if proc.returncode is None:  # interrupted: never leave the command running
            _kill_tree(proc, cgroup)
            proc.wait()
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    out, err = (bytes(b) for b in buffers.values())
    return Outcome(returncode, timed_out, out, err, truncated)
