"""``slotrunner demo --incident``: the event order of docs/architecture.md §Problem,
once without the fence, once with.

Both runs happen in a scratch home on the real stack: embedded Redis, the tool server,
a Celery worker (so ``--stop-pool`` has a pool to stop), the detector following the
log and paging a local receiver. Job A applies a patch in the only slot (200); the
slot is released and leased to job B (generation + 1); A's buffered apply is replayed
with its old envelope.

* fence off (the test server, ``python -m ops.testing.toolserver --fence off``): the
  replay lands in B's tree; the detector pages, the pool is stopped, and
  ``ops restore`` puts B's tree back from its own snapshot;
* fence on: the replay is refused 409 and there is nothing to page.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis

from ops.demo.sample_repo import init_repo
from ops.testing.stack import (
    Child,
    free_port,
    slotrunner_argv,
    stack_env,
    start_toolserver,
    start_worker,
)
from runner.core.logs import EventLog
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.redis_server import EmbeddedRedis
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces

LOCK_PY = "held_by = None\n"
A_PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""
PAGE_WAIT_S = 10.0
QUIET_WAIT_S = 3.0


@dataclass
class Timeline:
    fence: bool
    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    pages: list[dict[str, Any]] = field(default_factory=list)
    replay_status: int | None = None
    victim_intact: bool | None = None
    restored_tree: str | None = None
    start_tree: str | None = None
    pool_stopped: bool = False
    restored_bytes_equal: bool | None = None
    still_consuming: list[str] | None = None

    def note(self, text: str) -> None:
        self.events.append((time.monotonic() - self.started, text))


class Receiver:
    """A local Alertmanager stand-in: collects every alert posted to it."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    data = json.loads(body)
                except ValueError:
                    data = []
                receiver.alerts.extend(data if isinstance(data, list) else [data])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _repo(path: Path) -> str:
    return init_repo(path, {"pkg/lock.py": LOCK_PY})


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def _wait_consuming(broker_url: str, timeout_s: float = 30.0) -> None:
    """Wait until the worker consumes the queue, so the brake has something to stop."""
    from ops.restore import consuming_workers
    from ops.testing.stack import StackError

    try:
        poll_until(lambda: consuming_workers(broker_url, timeout_s=0.5), timeout_s, 0.2)
    except PollTimeout:
        raise StackError(f"the worker did not start consuming within {timeout_s:g}s") from None


def run_once(fence: bool, scratch: Path) -> Timeline:
    """One pass of the replay into a recycled slot; returns what happened, with timestamps."""
    timeline = Timeline(fence)
    home = scratch / ("fence-on" if fence else "fence-off")
    server = EmbeddedRedis(home)
    url = server.ensure()
    settings = Settings.from_env(
        {
            "SLOTRUNNER_HOME": str(home),
            "REDIS_URL": url,
            "SLOTRUNNER_SLOTS": "1",
            "SLOTRUNNER_HOST_ID": "demo-host",
            "SLOTRUNNER_SANDBOX": "off",
        }
    )
    port = free_port()
    settings = settings.with_(toolserver_url=f"http://127.0.0.1:{port}")
    env = stack_env(os.environ, **settings.to_env())
    receiver = Receiver()
    children: list[Child] = []
    try:
        settings.log_path.parent.mkdir(parents=True, exist_ok=True)
        settings.log_path.touch()
        children.append(start_toolserver(env, port, home, fence=fence))
        children.append(start_worker(env, home, concurrency=1, pool="solo"))
        children.append(
            Child(
                "detector",
                slotrunner_argv(
                    "ops",
                    "detect",
                    "--follow",
                    str(settings.log_path),
                    "--webhook",
                    receiver.url,
                    "--stop-pool",
                    "--state-dir",
                    str(home / "detector"),
                ),
                env,
                home / "detector.out",
            )
        )
        _wait_consuming(url)
        timeline.note(f"stack up: tool server (fence {'ON' if fence else 'OFF'}), worker, detector")
        repo_dir = scratch / f"repo-{int(fence)}"
        base = _repo(repo_dir)
        client = redis.Redis.from_url(url, decode_responses=True)
        pool = SlotPool(settings, client, EventLog(settings))
        workspaces = Workspaces(home)
        a = pool.lease("job-A", 1)
        workspaces.prepare(settings.slots_dir / a.slot_id, str(repo_dir), base, "job-A")
        timeline.note(f"job-A leases {a.slot_id} generation {a.generation}")
        body: dict[str, Any] = {
            "envelope": {
                "job_id": "job-A",
                "attempt": 1,
                "slot_id": a.slot_id,
                "generation": a.generation,
                "tool": "apply_patch",
                "idempotency_key": "job-A:apply:pkg/lock.py:1",
            },
            "args": {"patch": A_PATCH},
        }
        first = httpx.post(f"{settings.toolserver_url}/v1/tools/apply_patch", json=body, timeout=30)
        receipt = first.json().get("receipt") or {}
        timeline.note(f"job-A apply_patch -> HTTP {first.status_code} ({receipt.get('status')})")
        pool.release(a.slot_id, "job-A", a.generation)
        timeline.note(f"{a.slot_id} released by job-A")
        b = pool.lease("job-B", 1)
        slot_b = settings.slots_dir / b.slot_id
        prepared = workspaces.prepare(slot_b, str(repo_dir), base, "job-B")
        timeline.start_tree = prepared.start_tree
        before = _files(slot_b / "work")
        timeline.note(f"{b.slot_id} recycled to job-B at generation {b.generation}")
        url_apply = f"{settings.toolserver_url}/v1/tools/apply_patch"
        # The retry layer of docs/architecture.md §Problem resent the buffered bytes:
        # same key. The receipt store alone already answers that one from job-A's
        # receipt (nothing is applied again).
        same = httpx.post(url_apply, json=body, timeout=30)
        what = same.json().get("error") or (
            "answered from job-A's receipt" if same.json().get("replayed") else "applied"
        )
        timeline.note(f"replay of job-A's apply, same key -> {same.status_code} ({what})")
        # A retry layer that stamps a fresh request id defeats the receipts: only the
        # generation fence stands between it and job-B's tree.
        fresh = {**body, "envelope": {**body["envelope"], "idempotency_key": "job-A:retry-2"}}
        replay = httpx.post(url_apply, json=fresh, timeout=30)
        timeline.replay_status = replay.status_code
        what = replay.json().get("error") or (replay.json().get("receipt") or {}).get("status")
        timeline.note(f"replay of job-A's apply, fresh key -> {replay.status_code} ({what})")
        timeline.victim_intact = _files(slot_b / "work") == before
        timeline.note(
            "job-B's tree "
            + ("untouched" if timeline.victim_intact else "CHANGED by job-A's patch")
        )
        wait_s = PAGE_WAIT_S if not fence else QUIET_WAIT_S
        with contextlib.suppress(PollTimeout):  # fence on: no page is the expected answer
            poll_until(lambda: receiver.alerts, wait_s, 0.05)
        timeline.pages = list(receiver.alerts)
        if timeline.pages:
            kinds = sorted({a.get("labels", {}).get("alertname", "?") for a in timeline.pages})
            note = timeline.pages[0].get("annotations", {}).get("pool", "")
            timeline.pool_stopped = "pool stopped" in json.dumps(timeline.pages)
            timeline.note(f"detector paged: {', '.join(kinds)} {note}".rstrip())
        else:
            timeline.note(f"detector: nothing to page (watched {wait_s:g}s)")
        from ops.restore import consuming_workers, restore

        timeline.still_consuming = consuming_workers(url)
        if not timeline.victim_intact:
            done = restore(settings, "job-B", force=True, broker_url=url)
            timeline.restored_tree = done.tree
            timeline.restored_bytes_equal = _files(slot_b / "work") == before
            timeline.note(
                f"ops restore job-B --force -> tree {done.tree[:12]} verified "
                f"({'matches' if done.tree == prepared.start_tree else 'DIFFERS from'} its start)"
            )
    finally:
        for child in reversed(children):
            child.stop()
        receiver.close()
        server.leave()
    return timeline


def run(scratch: Path | None = None) -> tuple[Timeline, Timeline]:
    if scratch is None:
        scratch = Path(tempfile.mkdtemp(prefix="slotrunner-incident-"))
    return run_once(False, scratch), run_once(True, scratch)


def render(off: Timeline, on: Timeline) -> Any:
    from rich.table import Table

    table = Table(title="a buffered apply replayed into a recycled slot, twice", show_lines=False)
    table.add_column("fence OFF (test-only switch)", overflow="fold")
    table.add_column("fence ON (slotrunner's default)", overflow="fold")
    rows = max(len(off.events), len(on.events))
    for i in range(rows):
        cells = []
        for t in (off, on):
            cells.append(f"T+{t.events[i][0]:5.2f}s {t.events[i][1]}" if i < len(t.events) else "")
        table.add_row(*cells)
    return table
