"""The chaos campaign's stack: a real slotrunner on one host or several, in a scratch home.

Its own embedded Redis (never 127.0.0.1:6379) and one :class:`ops.testing.chaos.host.ChaosHost`
or more sharing it: on one host the host's home is the scratch home itself, on N
hosts each has its own under ``hosts/h1`` .. ``hosts/hN`` (its own slots, receipts,
attempt floors, log, tool server, proxy and workers), and every host's workers take
jobs from the one queue. Broker and liveness clocks are short, so redelivery,
takeover and reclaim happen within seconds.

The stack's gate (:meth:`ChaosStack.take_down`) keeps one host up at every moment: a
host is frozen or killed only while another one is up, so every job can finish.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from ops.testing.chaos.host import (
    DEAD,
    FAST_ENV,
    FROZEN,
    LEASE_TTL_S,
    UNACKED_RESTORE_S,
    UP,
    UPSTREAM_WAIT_S,
    VISIBILITY_S,
    ChaosHost,
    LogTail,
    wait_until,
)
from ops.testing.fault_proxy import Rule
from ops.testing.stack import StackError
from runner.core.settings import Settings
from runner.redis_server import EmbeddedRedis

__all__ = [
    "DEAD",
    "FAST_ENV",
    "FROZEN",
    "LEASE_TTL_S",
    "UNACKED_RESTORE_S",
    "UP",
    "UPSTREAM_WAIT_S",
    "VISIBILITY_S",
    "ChaosHost",
    "ChaosStack",
    "LogTail",
    "wait_until",
]


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
        hosts: int = 1,
    ) -> None:
        """``fence=False`` starts the tool servers with the envelope check off, and
        ``attempt_floor=False`` the workers without the host's attempt floor (the
        control runs of ``tests/e2e/test_chaos.py``). ``workers`` is per host.

        Each tool server is the stack's own process (``ops.testing.toolserver``), with
        the host's fault plan that the campaign arms while it runs (a crash after a
        call's effect, EIO on a slot's fsyncs); a normally started ``slotrunner
        toolserver`` never reads it. One host is named ``host`` and lives in ``home``;
        several are named ``h1`` .. ``hN`` and live in ``home/hosts/``."""
        self.home = home
        self.redis_server = EmbeddedRedis(home)
        self.redis_url = self.redis_server.ensure()
        base = {
            k: v
            for k, v in (os.environ if base_env is None else base_env).items()
            if not k.startswith("SLOTRUNNER_") and k != "REDIS_URL"
        }
        lock = threading.Lock()

        def make(name: str, host_home: Path, worker_names: list[str]) -> ChaosHost:
            return ChaosHost(
                name,
                host_home,
                redis_url=self.redis_url,
                base_env=base,
                slots=slots,
                workers=worker_names,
                concurrency=concurrency,
                fence=fence,
                attempt_floor=attempt_floor,
                proxy_lock=lock,
            )

        if hosts == 1:
            self.hosts = [make(host, home, [f"w{n + 1}" for n in range(workers)])]
        else:
            names = [f"h{i + 1}" for i in range(hosts)]
            self.hosts = [
                make(h, home / "hosts" / h, [f"{h}-w{n + 1}" for n in range(workers)])
                for h in names
            ]
        self.n_workers = workers
        self.redis = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self._gate = threading.Condition()
        self._app: Celery | None = None

    # -- the first host stands for the stack where one is needed ----------------------

    @property
    def settings(self) -> Settings:
        """The first host's: the submitting app's, and the checks' on one host."""
        return self.hosts[0].settings

    @property
    def env(self) -> dict[str, str]:
        return self.hosts[0].env

    @property
    def app(self) -> Celery:
        if self._app is None:
            from runner.worker.celery_app import create_app

            self._app = create_app(self.settings, redis_url=self.redis_url, env=self.env)
        return self._app

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start every host, side by side (a tool server takes a second or two)."""
        self._each(lambda h: h.start())

    def stop(self) -> None:
        self._each(lambda h: h.stop())
        self.redis.close()
        self.redis_server.leave()

    def _each(self, act: Callable[[ChaosHost], None]) -> None:
        if len(self.hosts) == 1:
            act(self.hosts[0])
            return
        errors: list[BaseException] = []

        def run(host: ChaosHost) -> None:
            try:
                act(host)
            except BaseException as exc:  # re-raised below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(h,)) for h in self.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    # -- what the hosts did, together ---------------------------------------------------

    @property
    def restarts(self) -> list[float]:
        return [t for h in self.hosts for t in h.restarts]

    @property
    def restart_errors(self) -> list[str]:
        return [e for h in self.hosts for e in h.restart_errors]

    @property
    def worker_restarts(self) -> list[str]:
        return [w for h in self.hosts for w in h.worker_restarts]

    def find(self, event: str, **match: Any) -> list[dict[str, Any]]:
        """Matching events of every host's log, host by host."""
        return [e for h in self.hosts for e in h.log.find(event, **match)]

    def events(self) -> list[dict[str, Any]]:
        """Every host's log, merged by time (one host: its lines in their order)."""
        if len(self.hosts) == 1:
            return self.hosts[0].log.poll()
        merged = [e for h in self.hosts for e in h.log.poll()]
        return sorted(merged, key=lambda e: str(e.get("ts", "")))

    def host_of(self, pid: int | None) -> ChaosHost | None:
        """The host one of whose workers' children is ``pid``."""
        if pid is None:
            return None
        return next((h for h in self.hosts if h.worker_group(pid) is not None), None)

    def host_named(self, name: str) -> ChaosHost:
        return next(h for h in self.hosts if h.name == name)

    def add_rule(self, rule: Rule) -> Rule:
        """One rule on every host's proxy: whichever host a job is on meets it, once."""
        for host in self.hosts:
            host.proxy.add(rule)
        return rule

    @property
    def rules(self) -> list[Rule]:
        return list(self.hosts[0].proxy.rules)

    # -- the gate: one host up at every moment ---------------------------------------------

    def take_down(self, host: ChaosHost, state: str, wait_s: float) -> bool:
        """Mark ``host`` FROZEN or DEAD, once another host is up (waited for up to
        ``wait_s``); False, and nothing changed, when none came up or ``host`` is not up."""

        def another_up() -> bool:
            return any(h.serving() for h in self.hosts if h is not host)

        with self._gate:
            if host.state != UP or not self._gate.wait_for(another_up, wait_s):
                return False
            host.state = state
            return True

    def bring_up(self, host: ChaosHost) -> None:
        with self._gate:
            host.state = UP
            self._gate.notify_all()

    def hold_worker(self, host: ChaosHost, group: int, wait_s: float) -> bool:
        """Count ``host``'s worker ``group`` as paused, once another worker (of any host)
        serves, waited for up to ``wait_s``; False when none did."""

        def another_serves() -> bool:
            return any(h.serving(besides=group) for h in self.hosts)

        with self._gate:
            if not self._gate.wait_for(another_serves, wait_s):
                return False
            host.paused.add(group)
            return True

    def release_worker(self, host: ChaosHost, group: int) -> None:
        with self._gate:
            host.paused.discard(group)
            self._gate.notify_all()

    def restart(self, host: ChaosHost) -> None:
        """Start the killed ``host`` again; it is up once its processes started."""
        try:
            host.restart()
        except StackError as exc:
            host.restart_errors.append(f"{host.name} did not come back: {exc}")
            raise
        self.bring_up(host)
