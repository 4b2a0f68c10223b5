"""The chaos campaign's stack: a real slotrunner on one host, in a scratch home.

Its own embedded Redis (never 127.0.0.1:6379), one tool server kept alive by a
supervisor thread (restarted on the same port when a fault kills it), a
:class:`ops.testing.fault_proxy.FaultProxy` in front of it, and Celery workers that reach
the tool server only through the proxy. Broker and liveness clocks are short, so
redelivery, takeover and reclaim happen within seconds.
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

import redis
from celery import Celery

from ops.testing.fault_proxy import FaultProxy
from ops.testing.faultplan import FaultPlan
from ops.testing.stack import Child, StackError, free_port, start_toolserver, start_worker
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.redis_server import EmbeddedRedis

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


class ChaosStack:
    def __init__(
        self,
        home: Path,
        *,
        host: str,
        slots: int,
        workers: int,
        concurrency: int = 2,
        fence: bool = True,
        attempt_floor: bool = True,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        """``fence=False`` starts the tool server with the envelope check off, and
        ``attempt_floor=False`` the workers without the host's attempt floor (the
        control runs of ``tests/e2e/test_chaos.py``).

        The tool server is the stack's own process (``ops.testing.toolserver``), with
        the fault plan in ``faults`` that the campaign arms while it runs (a crash
        after a call's effect, EIO on a slot's fsyncs); a normally started
        ``slotrunner toolserver`` never reads it."""
        self.home = home
        self.n_workers = workers
        self.concurrency = concurrency
        self.redis_server = EmbeddedRedis(home)
        self.redis_url = self.redis_server.ensure()
        self.port = free_port()
        self.toolserver_url = f"http://127.0.0.1:{self.port}"
        base = {
            k: v
            for k, v in (os.environ if base_env is None else base_env).items()
            if not k.startswith("SLOTRUNNER_") and k != "REDIS_URL"
        }
        self.settings = Settings.from_env(
            {
                "SLOTRUNNER_HOME": str(home),
                "REDIS_URL": self.redis_url,
                "SLOTRUNNER_SLOTS": str(slots),
                "SLOTRUNNER_HOST_ID": host,
                "SLOTRUNNER_LEASE_TTL_S": str(LEASE_TTL_S),
                "SLOTRUNNER_SANDBOX": os.environ.get("SLOTRUNNER_SANDBOX", "auto"),
                "SLOTRUNNER_TOOLSERVER_URL": self.toolserver_url,
            }
        )
        # Workers get the same settings but call the tool server through the fault proxy.
        self.env = {**base, "PYTHONUNBUFFERED": "1", **self.settings.to_env(), **FAST_ENV}
        self.fence = fence
        self.faults = FaultPlan(home / "faults")
        self.attempt_floor = attempt_floor
        self.log = LogTail(self.settings.log_path)
        self.redis = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.proxy = FaultProxy(
            self.toolserver_url, kill=self.kill_caller, upstream_wait_s=UPSTREAM_WAIT_S, record=True
        )
        self.toolserver: Child | None = None
        self.workers: list[Child] = []
        self.restarts: list[float] = []  # monotonic times the supervisor restarted the server
        self.restart_errors: list[str] = []
        self.worker_restarts: list[str] = []  # "<name>: <its last error line>"
        self._workers_lock = threading.Lock()
        self._workers_stopping = False
        self._worker_start_env: dict[str, str] = {}
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="chaos-supervisor")
        self._app: Celery | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.toolserver = self._start_toolserver()
        self._supervisor.start()
        proxy_url = self.proxy.start()
        self._worker_start_env = {**self.env, "SLOTRUNNER_TOOLSERVER_URL": proxy_url}
        with self._workers_lock:
            for n in range(self.n_workers):
                self.workers.append(self._start_worker(f"w{n + 1}"))

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

    @property
    def app(self) -> Celery:
        if self._app is None:
            from runner.worker.celery_app import create_app

            self._app = create_app(self.settings, redis_url=self.redis_url, env=self.env)
        return self._app

    def _supervise(self) -> None:
        """Restart the tool server on its port, and any worker, whenever one died.

        Workers are supervised as a deployment would (systemd, Kubernetes): Celery's
        worker exits with "Unrecoverable error" when its Redis broker refuses
        connections while it still holds unacked deliveries (kombu restores them on
        close through a connection that is already gone), which a Redis restart does.
        """
        while not self._stop.wait(0.05):
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
        with self._workers_lock:
            if self._workers_stopping:
                return
            for n, child in enumerate(self.workers):
                if child.alive():
                    continue
                child.stop()
                last = [
                    ln for ln in child.tail(200).splitlines() if "CRITICAL" in ln or "Error" in ln
                ]
                why = last[-1].strip()[:200] if last else f"exit {child.proc.returncode}"
                self.worker_restarts.append(f"{child.name}: {why}")
                self.workers[n] = self._start_worker(child.name)

    def stop_workers(self) -> None:
        with self._workers_lock:
            self._workers_stopping = True
        for child in self.workers:
            child.signal_group(signal.SIGCONT)  # a stopped group would ignore SIGTERM
            child.stop()

    def stop(self) -> None:
        self.stop_workers()
        self._stop.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=60)
        if self.toolserver is not None:
            self.toolserver.stop()
        self.proxy.stop()
        self.redis.close()
        self.redis_server.leave()

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
