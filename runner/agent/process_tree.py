"""An agent process and everything it starts, found and ended as one tree.

A ``command`` agent (``runner.agent.command``) is started in a session and process
group of its own (``start_new_session``), inside a fresh pids cgroup when this host
has a writable one (``tools.sandbox.cgroup``: the child joins it before it ``exec``s
the agent, so every process it ever starts is in it), and with a marker variable,
``SLOTRUNNER_AGENT_RUN``, unique to this run, in its environment. Ending it
(:meth:`AgentProcess.end`) kills, until none is left, every process that is

- in the agent's cgroup (which no process of its can leave without write access to
  a cgroup's ``procs`` file),
- in its session or its process group (a child that only ``setpgid``'s stays in the
  session),
- or carrying its marker in ``/proc/<pid>/environ`` (a ``setsid`` double fork that kept
  its environment).

So without a writable cgroup a process that both left the session and cleared its
environment escapes; with one, only a process with the rights to move itself out of
the cgroup does. Signals go through pidfds, so a recycled pid is never hit; the
agent itself is not reaped until its tree is gone, so its group id cannot be reused
meanwhile. Its output (stdout and stderr, one pipe) is read by a thread that keeps
the last :data:`TAIL_BYTES`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.sandbox.cgroup import PidsCgroup
from tools.sandbox.process import proc_stat

MARKER_ENV = "SLOTRUNNER_AGENT_RUN"
TAIL_BYTES = 16 * 1024
# A bound on the agent's processes, also what keeps a fork bomb from the host.
MAX_PIDS = 4096
# How long ending the tree may take before the survivors are reported.
KILL_WAIT_S = 10.0
_POLL_S = 0.01
# Join the cgroup (best effort: without it the session, group and marker still find
# the tree), then become the agent: the shell's pid is the agent's.
_JOIN = '{ echo $$ > "$1"; } 2>/dev/null; shift; exec "$@"'


class _Tail:
    """The last ``limit`` bytes of a stream, and how many came before them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        over = len(self.data) - self.limit
        if over > 0:
            del self.data[:over]
            self.dropped += over


@dataclass(frozen=True)
class Ended:
    """What :meth:`AgentProcess.end` did: the agent's status and the processes it left."""

    returncode: int  # as Popen says: negative for a signal
    leftovers: int  # processes of the tree other than the agent, killed at the end
    survivors: tuple[int, ...]  # pids still alive after KILL_WAIT_S (none, normally)


def new_marker() -> str:
    return uuid.uuid4().hex


class AgentProcess:
    """One agent process and its tree (see the module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        marker: str,
        use_cgroup: bool = True,
    ) -> None:
        self.marker = marker
        self.cgroup = PidsCgroup.create(MAX_PIDS) if use_cgroup else None
        child = list(argv)
        if self.cgroup is not None:
            child = ["/bin/sh", "-c", _JOIN, "sh", str(self.cgroup.procs_file), *child]
        try:
            self.proc = subprocess.Popen(
                child,
                cwd=cwd,
                env={**env, MARKER_ENV: marker},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self._drop_cgroup()
            raise
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self._pidfd = os.pidfd_open(self.pid)
        self._tail = _Tail(TAIL_BYTES)
        self._reader = threading.Thread(
            target=self._read, name=f"agent-out-{self.pid}", daemon=True
        )
        self._reader.start()

    # -- watching ---------------------------------------------------------------------

    def exited(self) -> bool:
        """Has the agent exited? Without reaping it, so its pid and group stay ours."""
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def wait_exit(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while not self.exited():
            if time.monotonic() >= end:
                return False
            time.sleep(_POLL_S)
        return True

    def terminate(self) -> None:
        """SIGTERM to the agent's process group: a chance to finish cleanly."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)

    # -- ending -------------------------------------------------------------------

    def end(self) -> Ended:
        """Kill the agent (if still running) and every process of its tree; then reap it.
        Returns once none is left alive, or after :data:`KILL_WAIT_S` with the survivors."""
        killed: set[int] = set()
        survivors: list[int] = []
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            found = [
                pid for pid in tree_pids(self.pid, self.marker, self.cgroup) if pid != self.pid
            ]
            if not self.exited():
                found.append(self.pid)
            if not found:
                break
            if time.monotonic() >= deadline:
                survivors = found
                break
            for pid in found:
                if _kill(pid):
                    killed.add(pid)
            time.sleep(_POLL_S)
        returncode = self.proc.wait()
        self._reader.join(2.0)  # a process we could not kill may hold the pipe
        self._drop_cgroup()
        os.close(self._pidfd)
        return Ended(returncode, len(killed - {self.pid}), tuple(sorted(survivors)))

    def output(self) -> tuple[str, bool]:
        """The tail of the agent's output (decoded leniently), and whether it was cut."""
        data = bytes(self._tail.data)
        return data.decode("utf-8", errors="replace"), self._tail.dropped > 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as stream:
            while chunk := os.read(stream.fileno(), 64 * 1024):
                self._tail.add(chunk)

    def _drop_cgroup(self) -> None:
        # An older attempt's successor may have ended the tree and removed it already.
        if self.cgroup is not None and self.cgroup.path.is_dir():
            self.cgroup.remove()


def _kill(pid: int) -> bool:
    """SIGKILL ``pid`` through a pidfd; False when it was gone already."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def tree_pids(leader: int, marker: str, cgroup: PidsCgroup | None) -> list[int]:
    """Live (not zombie) processes of an agent's tree: in its cgroup, in its session or
    process group (both ``leader``), or carrying its marker."""
    found = set(cgroup.pids()) if cgroup is not None else set()
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z":
            found.discard(pid)
            continue
        if leader in stat[1:] or pid in found or _has_marker(pid, needle):
            found.add(pid)
    return sorted(pid for pid in found if _alive(pid))


def _has_marker(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def end_marked(marker: str, cgroup: Path | None) -> int:
    """Kill what is left of an agent tree known only by its marker and cgroup (an older
    attempt's, whose worker died): returns how many processes were killed."""
    group = PidsCgroup(cgroup) if cgroup is not None and cgroup.is_dir() else None
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        # No leader to match on: its pid may belong to anyone by now.
        found = tree_pids(-1, marker, group)
        if not found:
            break
        killed.update(pid for pid in found if _kill(pid))
        time.sleep(_POLL_S)
    if group is not None and group.path.is_dir():
        group.remove()
    return len(killed)
