"""A child already in its fresh pids cgroup, waiting for its command: the join off the call.

Joining a cgroup means writing a pid into ``cgroup.procs``, and the kernel's migration
waits for an RCU grace period unless one ran moments before: 1-2 ms between calls
made back to back, some 10 ms on a host whose last migration is a few tens of
milliseconds old, which is every agent's (``bench/exec_start.py``). So the join is
done ahead of the call: a *zygote* is ``bash`` started in its own session that writes
its pid into a fresh cgroup's ``cgroup.procs`` (or exits 126) and then waits for a line
on its stdin. A call takes a zygote, sets its rlimits with ``prlimit(2)`` while it
waits, writes the whole NUL-separated argv into a memfd the zygote holds, then sends
the line: the zygote reads the argv, points its stdin at ``/dev/null``, closes the
memfd and ``exec``s the argv (bubblewrap). The command is the zygote's pid, so it is
in the cgroup from its first instruction, its process group and session are the
zygote's, and everything else is as in ``tools/sandbox/process.py`` (docs/architecture.md
§I9). Nothing runs before the line; a zygote whose server dies gets EOF and exits 126.

Only bubblewrap runs are started this way, and only with a bwrap that takes
``--clearenv``: the zygote's own environment is fixed, so the command's is set by
bubblewrap's ``--clearenv --setenv`` in front of the argv (:func:`with_env`). A zygote
that cannot be used (it exited, its limits could not be set) is killed and its
cgroup removed; the caller then runs the command the ordinary way. One zygote waits
per kind of pipes (merged or not); the next one is started in a thread once a run is
over. Zygotes belong to the process that started them: a forked child drops its
parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tools.sandbox.cgroup import PidsCgroup, sweep_dead
from tools.sandbox.policy import DEFAULT_PATH, sandbox_env

# $1: the cgroup.procs file, $2: the memfd's number. Join or exit; wait for the line;
# read the argv; stdin back to /dev/null, the memfd closed; become the argv.
_SCRIPT = (
    'echo $$ > "$1" || exit 126; read -r _ || exit 126; '
    'mapfile -d "" -t argv <&"$2" || exit 126; fd=$2; '
    'exec {fd}<&- 0<>/dev/null || exit 126; exec "${argv[@]}"'
)
_GO = b"go\n"
# How long no run may have been going before a zygote is started: its join stalls
# every fork on the host until the kernel's grace period ends, so it waits for a lull
# (calls made back to back run the ordinary way; an agent's, seconds apart, do not).
QUIET_S = 0.05


@functools.cache
def find_bash() -> str | None:
    """The system's bash (not the caller's PATH)."""
    return shutil.which("bash", path=DEFAULT_PATH)


@functools.cache
def takes_clearenv(bwrap: str) -> bool:
    """Whether this bubblewrap has ``--clearenv`` (0.5.0 and later)."""
    try:
        shown = subprocess.run(
            [bwrap, "--help"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--clearenv" in shown.stdout + shown.stderr


def with_env(bwrap_command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``bwrap_command`` with the command's whole environment set by bubblewrap."""
    pairs = [part for key, value in env.items() for part in ("--setenv", key, value)]
    return [bwrap_command[0], "--clearenv", *pairs, *bwrap_command[1:]]


@dataclass
class Zygote:
    proc: subprocess.Popen[bytes]
    cgroup: PidsCgroup
    go: int  # the write end of the zygote's stdin
    argv_fd: int  # the memfd the zygote reads its argv from
    max_pids: int
    owner: int = field(default_factory=os.getpid)

    def start(
        self, command: Sequence[str], rows: Sequence[tuple[str, int, int]], max_pids: int
    ) -> bool:
        """Set the limits, hand over the argv and let it run; False: it cannot be used
        (the caller discards it). Nothing has run when this returns False."""
        if self.proc.poll() is not None:
            return False
        data = b"".join(os.fsencode(arg) + b"\0" for arg in command)
        try:
            if max_pids != self.max_pids:
                (self.cgroup.path / "pids.max").write_text(str(max_pids))
                self.max_pids = max_pids
            for name, soft, hard in rows:
                resource.prlimit(self.proc.pid, getattr(resource, name), (soft, hard))
            if os.pwrite(self.argv_fd, data, 0) != len(data):
                return False
            os.close(self.argv_fd)
            self.argv_fd = -1
            written = os.write(self.go, _GO)
        except (OSError, ValueError):
            return False
        finally:
            self._close_fds()
        return written == len(_GO)

    def discard(self) -> None:
        """Kill it (it never ran a command) and remove its cgroup."""
        self._close_fds()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 9)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.cgroup.remove()

    def _close_fds(self) -> None:
        for name in ("go", "argv_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def spawn(max_pids: int, merged: bool) -> Zygote | None:
    """A zygote in a fresh cgroup of ``max_pids``; None without bash or a cgroup."""
    bash = find_bash()
    if bash is None:
        return None
    cgroup = PidsCgroup.create(max_pids)
    if cgroup is None:
        return None
    read_end, go = os.pipe()
    argv_fd = -1
    try:
        argv_fd = os.memfd_create("slotrunner-argv", os.MFD_CLOEXEC)
        proc = subprocess.Popen(
            [bash, "-c", _SCRIPT, "bash", str(cgroup.procs_file), str(argv_fd)],
            cwd="/",
            env=sandbox_env(None),
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            start_new_session=True,
            pass_fds=(argv_fd,),
        )
    except OSError:
        for fd in (go, argv_fd):
            if fd >= 0:
                os.close(fd)
        cgroup.remove()
        return None
    finally:
        os.close(read_end)
    return Zygote(proc, cgroup, go, argv_fd, max_pids)


class Pool:
    """At most one waiting zygote per kind of pipes, refilled in a thread once taken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: dict[bool, Zygote] = {}
        self.filling: set[bool] = set()
        self.failed: set[bool] = set()  # no zygote could be started: not tried again
        self.enabled = True
        self.running = 0  # runs going on in this process
        self.last_end = 0.0
        self.swept = False

    def begin(self) -> None:
        """A run starts (no zygote is started while one goes on)."""
        with self.lock:
            self.running += 1

    def end(self) -> None:
        with self.lock:
            self.running -= 1
            self.last_end = time.monotonic()

    def _quiet(self) -> bool:
        with self.lock:
            return not self.running and time.monotonic() - self.last_end >= QUIET_S

    def take(self, merged: bool) -> Zygote | None:
        """The waiting zygote of this kind, or None."""
        with self.lock:
            zygote = self.ready.pop(merged, None)
        if zygote is not None and zygote.owner != os.getpid():
            zygote.discard()
            return None
        return zygote

    def refill(self, max_pids: int, merged: bool) -> None:
        """Start the next zygote of this kind in a thread, unless one waits or starts;
        the thread waits for a lull first (:data:`QUIET_S`)."""
        with self.lock:
            if not self.enabled or merged in self.ready or {merged} & (self.filling | self.failed):
                return
            self.filling.add(merged)
        threading.Thread(target=self._fill, args=(max_pids, merged), daemon=True).start()

    def _fill(self, max_pids: int, merged: bool) -> None:
        zygote: Zygote | None = None
        try:
            while self.enabled and not self._quiet():
                time.sleep(QUIET_S)
            if not self.swept:  # once a process: what killed servers' zygotes left
                self.swept = True
                sweep_dead()
            zygote = spawn(max_pids, merged) if self.enabled else None
        finally:
            with self.lock:
                self.filling.discard(merged)
                old = self.ready.pop(merged, None)
                if zygote is None and self.enabled:
                    self.failed.add(merged)
                elif zygote is not None and self.enabled:
                    self.ready[merged], zygote = zygote, None
        for extra in (old, zygote):
            if extra is not None:
                extra.discard()

    def close(self) -> None:
        """Discard every waiting zygote; none is started again."""
        with self.lock:
            self.enabled = False
            waiting, self.ready = list(self.ready.values()), {}
        for zygote in waiting:
            if zygote.owner == os.getpid():
                zygote.discard()

    def forget(self) -> None:
        """In a forked child: the parent's zygotes are not ours; close our copies only."""
        self.lock = threading.Lock()
        for zygote in self.ready.values():
            zygote._close_fds()
        self.ready, self.filling, self.failed = {}, set(), set()
        self.running = 0


POOL = Pool()
atexit.register(POOL.close)
os.register_at_fork(after_in_child=POOL.forget)
