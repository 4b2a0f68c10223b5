"""The real stack for job tests: a tool server, Celery workers, gated jobs, the host's log.

A *gated* job runs a ``run_tests`` whose command writes ``started`` into its work tree
and then waits for a ``go`` file there: the test decides when the call ends, so no
test sleeps to wait for a race. Everything else is read from the host's JSONL log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import redis

from ops.testing.faultplan import FaultPlan
from ops.testing.stack import Child, start_worker
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.jobs.models import JobResult
from runner.jobs.submit import wait_for
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer, child_env

T = TypeVar("T")

GATE = """
import pathlib, time
pathlib.Path("started").write_text("1")
give_up = time.monotonic() + 45
while not pathlib.Path("go").exists():
    if time.monotonic() > give_up:
        raise SystemExit(3)
    time.sleep(0.05)
"""

# Broker and liveness clocks short enough for tests: a copy of a job is redelivered
# ~3-4 s after its delivery (with ``stack(..., UNACKED_RESTORE_S, **FAST)``), and a
# silent attempt is taken over 3 s after its last beat.
FAST = {
    "SLOTRUNNER_VISIBILITY_TIMEOUT_S": "3",
    "SLOTRUNNER_HEARTBEAT_TTL_S": "3",
    "SLOTRUNNER_HEARTBEAT_INTERVAL_S": "0.5",
    "SLOTRUNNER_JANITOR_INTERVAL_S": "1",
}
# kombu restores unacked deliveries past the visibility timeout this often. An option
# of the test worker (``ops.testing.worker``), not an environment variable: a normally
# started ``slotrunner worker`` has no way to take it.
UNACKED_RESTORE_S = 1.0


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float = 40.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    try:
        return poll_until(probe, timeout_s, 0.05, what=what)
    except PollTimeout:
        raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}") from None


class GatedJobs:
    """Scripted jobs on ``repo`` at ``base`` whose test command is the gate, submitted
    through ``app`` and ``redis`` and awaited (for :class:`Stack` and the several-hosts
    cluster of ``tests/support/hosts.py``)."""

    repo: Path
    base: str
    app: Any
    redis: redis.Redis

    def tails(self) -> str:
        raise NotImplementedError

    def spec(self, job_id: str, steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "repo": str(self.repo),
            "base": self.base,
            "test_command": [sys.executable, "-c", GATE],
            "planner": {"kind": "scripted", "steps": steps},
            **extra,
        }

    def submit(self, job_id: str, steps: list[dict[str, Any]], **extra: Any) -> str:
        from runner.jobs.submit import submit

        submit(self.app, self.redis, self.spec(job_id, steps, **extra))
        return job_id

    def result(self, job_id: str, timeout_s: float = 60.0) -> JobResult:
        found = wait_for(self.redis, [job_id], timeout_s, poll_s=0.05).get(job_id)
        assert found is not None, f"no result for {job_id}:\n" + self.tails()
        return found


class Stack(GatedJobs):
    """A tool server and some Celery workers serving one test's home.

    Workers are ``slotrunner worker``; given ``unacked_restore_s``, the test worker
    that restores unacked deliveries that often. (Positional, so that no ``**env``
    can fill it.)
    """

    def __init__(
        self,
        settings: Settings,
        tmp_path: Path,
        unacked_restore_s: float | None = None,
        /,
        **extra_env: str,
    ) -> None:
        self.tmp_path = tmp_path
        self.unacked_restore_s = unacked_restore_s
        self.server = ToolServer(settings, tmp_path / "logs")
        self.settings = self.server.settings
        self.env = child_env(self.settings, **extra_env)
        self.workers: list[Child] = []
        self.redis = redis.Redis.from_url(self.settings.redis_url or "", decode_responses=True)
        from runner.worker.celery_app import create_app

        self.app = create_app(self.settings)
        self.repo = tmp_path / "repo"
        self.base = make_repo(self.repo, {"pkg/__init__.py": "", "README": "sample\n"})

    def worker(self, name: str, concurrency: int = 1, *, faults: FaultPlan | None = None) -> Child:
        """A worker; given a fault plan, the test worker that obeys it."""
        child = start_worker(
            self.env,
            self.tmp_path / "logs",
            name=name,
            concurrency=concurrency,
            unacked_restore_s=self.unacked_restore_s,
            faults=faults.root if faults is not None else None,
        )
        self.workers.append(child)
        return child

    def close(self) -> None:
        for child in self.workers:
            child.signal_group(signal.SIGCONT)  # a stopped group would ignore SIGTERM
            child.stop()
        self.server.stop()
        self.redis.close()

    def tails(self) -> str:
        return "\n".join(f"--- {c.name}\n{c.tail()}" for c in self.workers)

    # -- the log ------------------------------------------------------------------

    def events(self, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        try:
            text = self.settings.log_path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written right now
            if event is not None and record.get("event") != event:
                continue
            if all(record.get(k) == v for k, v in match.items()):
                out.append(record)
        return out

    def wait_event(
        self, what: str, event: str, timeout_s: float = 40.0, **match: Any
    ) -> dict[str, Any]:
        return wait_until(what, lambda: next(iter(self.events(event, **match)), None), timeout_s)

    def applied_keys(self, job_id: str) -> Counter[str]:
        return Counter(
            e["idempotency_key"]
            for e in self.events("tool_result", job_id=job_id, outcome="applied")
        )

    # -- slots and gates ----------------------------------------------------------

    def work(self, slot_id: str) -> Path:
        return self.settings.slots_dir / slot_id / "work"

    def open_gate(self, job_id: str, attempt: int) -> str:
        """Wait until that attempt's gated run_tests runs, then let it finish."""
        started = self.wait_event(
            f"{job_id} attempt {attempt} to start run_tests",
            "slot_leased",
            job_id=job_id,
            attempt=attempt,
        )
        slot = str(started["slot_id"])
        self.wait_event(
            f"{job_id} attempt {attempt} step 0",
            "tool_result",
            job_id=job_id,
            attempt=attempt,
            slot_id=slot,
            tool="write_file",
        )
        wait_until(f"{job_id} run_tests to start", lambda: (self.work(slot) / "started").exists())
        (self.work(slot) / "go").write_text("")
        return slot

    def owner_of(self, job_id: str, attempt: int) -> Child:
        """The worker (process group) running that attempt."""
        started = self.wait_event(
            f"{job_id} attempt {attempt}", "job_started", job_id=job_id, attempt=attempt
        )
        group = os.getpgid(int(started["pid"]))
        return next(c for c in self.workers if c.pid == group)


@contextmanager
def stack(
    settings: Settings, tmp_path: Path, unacked_restore_s: float | None = None, /, **extra_env: str
) -> Iterator[Stack]:
    running = Stack(settings, tmp_path, unacked_restore_s, **extra_env)
    try:
        yield running
    finally:
        running.close()


def gated_steps(tail: bool = True) -> list[dict[str, Any]]:
    """write_file a, the gated run_tests, and (with ``tail``) write_file b."""
    steps: list[dict[str, Any]] = [
        {"tool": "write_file", "args": {"path": "notes/a.md", "content": "a\n"}},
        {"tool": "run_tests", "args": {}},
    ]
    if tail:
        steps.append({"tool": "write_file", "args": {"path": "notes/b.md", "content": "b\n"}})
    return steps


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.cli.main", *args],
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
