"""One host of the chaos campaign: its home, tool server, fault proxy and workers.

A host is what docs/architecture.md §Several hosts calls one: its own
``SLOTRUNNER_HOST_ID``, home (slots, receipts, attempt floors, log), a tool server kept
alive by a supervisor thread (restarted on the same port when a fault kills it), a
:class:`ops.testing.fault_proxy.FaultProxy` in front of it and Celery workers that
reach the tool server only through that proxy. Every host of a campaign talks to the
stack's one Redis (``ops.testing.chaos.stack``).

The whole-host faults act here: :meth:`ChaosHost.kill` SIGKILLs every process of the
host at once (all stopped first, so none acts while the others die), :meth:`freeze`
and :meth:`thaw` SIGSTOP and SIGCONT them all, :meth:`restart` starts the host again
on the same home and port. A process is the host's when it is one of its children's
process groups or its environment names the host's home (a sandbox in a session of
its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ops.testing.fault_proxy import FaultProxy
from ops.testing.faultplan import FaultPlan
from ops.testing.stack import Child, StackError, free_port, start_toolserver, start_worker
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.core.stamp import StampError, read_stamp

# Redelivery ~4 s after a delivery, takeover 3 s after an attempt's last beat: the
# environment's knobs, and kombu's restore of unacked deliveries every second (an
# option of the test worker, ``ops.testing.worker``, that a normal worker never reads).
FAST_ENV = {
    "SLOTRUNNER_VISIBILITY_TIMEOUT_S": "3",
    "SLOTRUNNER_HEARTBEAT_TTL_S": "3",
    "SLOTRUNNER_HEARTBEAT_INTERVAL_S": "0.5",
    "SLOTRUNNER_JANITOR_INTERVAL_S": "1",
}
VISIBILITY_S = float(FAST_ENV["SLOTRUNNER_VISIBILITY_TIMEOUT_S"])
UNACKED_RESTORE_S = 1.0
LEASE_TTL_S = 20.0
UPSTREAM_WAIT_S = 30.0  # the proxy waits this long for a restarting tool server
UP, FROZEN, DEAD = "up", "frozen", "dead"


class LogTail:
    """The host's JSONL log, read incrementally; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def poll(self) -> list[dict[str, Any]]:
        with self._lock:
            try:
                with open(self.path, "rb") as handle:
                    handle.seek(self._offset)
                    data = handle.read()
            except FileNotFoundError:
                return self.events
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self._offset += end
            for line in data[:end].splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        self.events.append(record)
            return list(self.events)

    def find(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.poll()
            if e.get("event") == event and all(e.get(k) == v for k, v in match.items())
        ]


def wait_until(probe: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
    """``probe()``'s first truthy answer, or None when ``timeout_s`` ran out first."""
    try:
        return poll_until(probe, timeout_s, poll_s)
    except PollTimeout:
        return None


def pids_of_home(home: Path) -> list[int]:
    """Processes (ours excluded) whose environment sets ``SLOTRUNNER_HOME`` to ``home``
    or whose command line names a path under it."""
    env_entry = b"SLOTRUNNER_HOME=" + str(home).encode()
    under = str(home).encode() + b"/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if env_entry in environ or under in cmdline:
            found.append(int(entry))
    return found


class ChaosHost:
    def __init__(
        self,
        name: str,
        home: Path,
        *,
        redis_url: str,
        base_env: Mapping[str, str],
        slots: int,
        workers: list[str],
        concurrency: int = 2,
        fence: bool = True,
        attempt_floor: bool = True,
        proxy_lock: threading.Lock | None = None,
    ) -> None:
        """``workers`` names this host's workers; ``fence`` and ``attempt_floor`` as for
        :class:`ops.testing.chaos.stack.ChaosStack`; ``proxy_lock`` is shared by every
        host's proxy (they share the campaign's rules)."""
        self.name = name
        self.home = home
        self.worker_names = list(workers)
        self.concurrency = concurrency
        self.port = free_port()
        self.toolserver_url = f"http://127.0.0.1:{self.port}"
        self.settings = Settings.from_env(
            {
                "SLOTRUNNER_HOME": str(home),
                "REDIS_URL": redis_url,
                "SLOTRUNNER_SLOTS": str(slots),
                "SLOTRUNNER_HOST_ID": name,
                "SLOTRUNNER_LEASE_TTL_S": str(LEASE_TTL_S),
                "SLOTRUNNER_SANDBOX": os.environ.get("SLOTRUNNER_SANDBOX", "auto"),
                "SLOTRUNNER_TOOLSERVER_URL": self.toolserver_url,
            }
        )
        # Workers get the same settings but call the tool server through the fault proxy.
        self.env = {**base_env, "PYTHONUNBUFFERED": "1", **self.settings.to_env(), **FAST_ENV}
        self.fence = fence
        self.faults = FaultPlan(home / "faults")
        self.attempt_floor = attempt_floor
        self.log = LogTail(self.settings.log_path)
        self.proxy = FaultProxy(
            self.toolserver_url,
            kill=self.kill_caller,
            upstream_wait_s=UPSTREAM_WAIT_S,
            record=True,
            lock=proxy_lock,
        )
        self.toolserver: Child | None = None
        self.workers: list[Child] = []
        self.restarts: list[float] = []  # monotonic times the supervisor restarted the server
        self.restart_errors: list[str] = []
        self.worker_restarts: list[str] = []  # "<name>: <its last error line>"
        self.state = UP  # UP, FROZEN or DEAD; only the stack's gate changes it
        self.paused: set[int] = set()  # worker groups the pause fault holds stopped
        # (log length, {slot: generation} of the leases open) when it was killed, and
        # the log's length when it came back: what the restart checks look at.
        self.killed_at: list[tuple[int, dict[str, int]]] = []
        self.restarted_at: list[int] = []
        self._lock = threading.Lock()  # the children and their supervision
        self._stopping = False
        self._worker_start_env: dict[str, str] = {}
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name=f"chaos-{name}")

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.toolserver = self._start_toolserver()
        self._supervisor.start()
        proxy_url = self.proxy.start()
        self._worker_start_env = {**self.env, "SLOTRUNNER_TOOLSERVER_URL": proxy_url}
        with self._lock:
            for name in self.worker_names:
                self.workers.append(self._start_worker(name))

    def _start_toolserver(self) -> Child:
        return start_toolserver(
            self.env, self.port, self.home / "logs", fence=self.fence, faults=self.faults.root
        )

    def _start_worker(self, name: str) -> Child:
        return start_worker(
            self._worker_start_env,
            self.home / "logs",
            name=name,
            concurrency=self.concurrency,
            unacked_restore_s=UNACKED_RESTORE_S,
            attempt_floor=self.attempt_floor,
        )

    def _supervise(self) -> None:
        """Restart the tool server on its port, and any worker, whenever one died
        while the host is up (a killed host stays dead until :meth:`restart`).

        Workers are supervised as a deployment would (systemd, Kubernetes): Celery's
        worker exits with "Unrecoverable error" when its Redis broker refuses
        connections while it still holds unacked deliveries (kombu restores them on
        close through a connection that is already gone), which a Redis restart does.
        """
        while not self._stop.wait(0.05):
            with self._lock:
                if self._stopping or self.state != UP:
                    continue
                self._supervise_workers()
                child = self.toolserver
                if child is None or child.alive():
                    continue
                child.stop()
                self.restarts.append(time.monotonic())
                try:
                    self.toolserver = self._start_toolserver()
                except StackError as exc:
                    self.restart_errors.append(str(exc))
                    return

    def _supervise_workers(self) -> None:
        for n, child in enumerate(self.workers):
            if child.alive():
                continue
            child.stop()
            last = [ln for ln in child.tail(200).splitlines() if "CRITICAL" in ln or "Error" in ln]
            why = last[-1].strip()[:200] if last else f"exit {child.proc.returncode}"
            self.worker_restarts.append(f"{child.name}: {why}")
            self.workers[n] = self._start_worker(child.name)

    def stop_workers(self) -> None:
        with self._lock:
            self._stopping = True
        for child in self.workers:
            child.signal_group(signal.SIGCONT)  # a stopped group would ignore SIGTERM
            child.stop()

    def stop(self) -> None:
        self.stop_workers()
        self._stop.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=60)
        if self.toolserver is not None:
            self.toolserver.signal_group(signal.SIGCONT)
            self.toolserver.stop()
        self.proxy.stop()

    # -- the workers' processes -----------------------------------------------------

    def worker_group(self, pid: int) -> int | None:
        """The process group of a worker *child* ``pid``; None for anything else."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        if pid == group or group not in {w.pid for w in self.workers}:
            return None
        return group

    def kill_caller(self, pid: int) -> None:
        # Only ever one of our workers' children: the header is not trusted alone.
        if self.worker_group(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def serving(self, besides: int | None = None) -> bool:
        """Up, with a worker that is not paused (nor ``besides``): it can take a job."""
        held = self.paused | {besides}
        return self.state == UP and any(w.pid not in held for w in self.workers)

    # -- the whole host -----------------------------------------------------------

    def _children(self) -> list[Child]:
        return [c for c in (self.toolserver, *self.workers) if c is not None]

    def _stop_all(self) -> list[int]:
        """SIGSTOP every process of the host; the pids stopped outside its groups."""
        for child in self._children():
            child.signal_group(signal.SIGSTOP)
        groups = {c.pid for c in self._children()}
        strays = []
        for pid in pids_of_home(self.home):
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) not in groups:
                    os.kill(pid, signal.SIGSTOP)
                    strays.append(pid)
        return strays

    def kill(self) -> tuple[int, int]:
        """SIGKILL every process of the host at once; how many process groups, and how
        many processes outside them (a sandbox in a session of its own), died.

        The caller has set the host DEAD (the stack's gate) so nothing restarts them."""
        with self._lock:
            strays = self._stop_all()
            children = self._children()
            for child in children:
                child.signal_group(signal.SIGKILL)
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for child in children:
                child.stop()  # reaps it and closes its log
            self.killed_at.append((len(self.log.poll()), self.open_leases()))
            return len(children), len(strays)

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the host; give the result to :meth:`thaw`."""
        with self._lock:
            return self._stop_all()

    def thaw(self, strays: list[int]) -> None:
        """SIGCONT what :meth:`freeze` stopped; a worker the pause fault holds stays
        stopped (that fault resumes it)."""
        with self._lock:
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            for child in self._children():
                if child.pid not in self.paused:
                    child.signal_group(signal.SIGCONT)

    def restart(self) -> None:
        """The killed host again, on the same home and port: a tool server and workers
        of the same names. Its janitor settles the dead attempts' slots."""
        with self._lock:
            self.faults.disarm_crash()
            self.restarted_at.append(len(self.log.poll()))
            self.toolserver = self._start_toolserver()
            self.workers = [self._start_worker(name) for name in self.worker_names]

    def open_leases(self) -> dict[str, int]:
        """Slot -> generation of every lease the slot stamps show open."""
        found = {}
        for n in range(self.settings.slots):
            try:
                stamp = read_stamp(self.settings.slots_dir / f"S{n}")
            except StampError:
                continue
            if stamp is not None and stamp.lease_open():
                found[stamp.slot_id] = stamp.generation
        return found
