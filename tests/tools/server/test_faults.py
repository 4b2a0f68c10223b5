"""Faults on the path of one tool call: crashes, lost replies, 429s (I2, I3, I4)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.testing.fault_proxy import FaultProxy, Rule
from ops.testing.faultplan import FaultPlan
from runner.core.logs import EventLog
from runner.core.stamp import Stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.client import ToolClient, ToolResponse
from tools.envelope import Envelope

PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""


def leased(server: ToolServer, tmp_path: Path, job_id: str = "job-A") -> tuple[Stamp, Path]:
    settings = server.settings
    repo = tmp_path / "repo"
    base = make_repo(repo)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    stamp = SlotPool(settings, client, EventLog(settings)).lease(job_id, 1)
    slot_dir = settings.slots_dir / stamp.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, job_id)
    return stamp, slot_dir


def envelope(stamp: Stamp, tool: str, key: str | None) -> Envelope:
    assert stamp.job_id is not None and stamp.attempt is not None
    return Envelope(
        job_id=stamp.job_id,
        attempt=stamp.attempt,
        slot_id=stamp.slot_id,
        generation=stamp.generation,
        tool=tool,
        idempotency_key=key,
    )


def receipt_statuses(slot_dir: Path, key: str) -> list[str]:
    lines = (slot_dir / "receipts.jsonl").read_text().splitlines()
    return [json.loads(line)["status"] for line in lines if json.loads(line)["key"] == key]


def applied_lines(server: ToolServer, key: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in server.settings.log_path.read_text().splitlines()]
    return [
        line
        for line in lines
        if line["event"] == "tool_result"
        and line.get("idempotency_key") == key
        and line["outcome"] == "applied"
    ]


CASES = [
    ("write_file", {"path": "pkg/lock.py", "content": 'held_by = "A"\n'}),
    ("apply_patch", {"patch": PATCH}),
]


@pytest.mark.parametrize(("tool", "args"), CASES, ids=[c[0] for c in CASES])
def test_server_killed_between_intent_and_outcome(
    settings: Any, tmp_path: Path, tool: str, args: dict[str, Any]
) -> None:
    """SIGKILL after the effect, before the outcome: on restart the intent resolves from
    the tree, the client's reconcile gets the receipt, and the effect exists once."""
    server = ToolServer(settings, tmp_path / "logs", faults=True)
    assert server.faults is not None
    server.faults.arm_crash(tool=tool)
    try:
        stamp, slot_dir = leased(server, tmp_path)
        key = f"job-A:crash:{tool}"
        client = ToolClient(server.url, timeout_s=10)
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["response"] = client.call(
                    envelope(stamp, tool, key), args, slot_dir=slot_dir, deadline_s=60
                )
            except Exception as exc:  # surfaced by the assertions below
                outcome["error"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        assert server.child is not None
        server.child.proc.wait(timeout=30)  # the injected SIGKILL
        assert server.child.proc.returncode == -9
        assert not server.faults.crash_armed()  # consumed: the restart does not crash
        # The crash left an intent and no outcome.
        assert receipt_statuses(slot_dir, key) == ["intent"]
        inode = (slot_dir / "work" / "pkg" / "lock.py").stat().st_ino
        server.stop()
        server.start()
        thread.join(timeout=60)
        assert "error" not in outcome, outcome.get("error")
        response: ToolResponse = outcome["response"]
        assert response.reconciled and response.receipt is not None
        assert response.receipt["status"] == "applied"
        assert receipt_statuses(slot_dir, key) == ["intent", "applied"]
        lock = slot_dir / "work" / "pkg" / "lock.py"
        assert lock.read_text() == 'held_by = "A"\n'
        assert lock.stat().st_ino == inode  # never written a second time
        assert len(applied_lines(server, key)) == 1
        client.close()
    finally:
        server.stop()


def test_lost_response_is_reconciled_not_replayed(toolserver: ToolServer, tmp_path: Path) -> None:
    """The server applies, the reply is lost on the way: reconcile returns the receipt."""
    stamp, slot_dir = leased(toolserver, tmp_path)
    proxy = FaultProxy(toolserver.url)
    proxy.add(Rule("lose_response", "/v1/tools/apply_patch"))
    url = proxy.start()
    client = ToolClient(url, timeout_s=10)
    try:
        key = "job-A:lost:apply"
        response = client.call(
            envelope(stamp, "apply_patch", key), {"patch": PATCH}, slot_dir=slot_dir, deadline_s=30
        )
    finally:
        client.close()
        proxy.stop()
    assert proxy.stats["lose_response"] == 1
    assert response.reconciled and response.replayed
    assert response.receipt is not None and response.receipt["status"] == "applied"
    assert client.decisions["reconcile"] == 1 and client.decisions["resend_after_reconcile"] == 0
    assert receipt_statuses(slot_dir, key) == ["intent", "applied"]
    assert (slot_dir / "work" / "pkg" / "lock.py").read_text() == 'held_by = "A"\n'
    assert len(applied_lines(toolserver, key)) == 1


def test_429_after_an_apply_never_replays_the_apply(toolserver: ToolServer, tmp_path: Path) -> None:
    """apply_patch succeeds, run_tests gets 429: run_tests is retried after Retry-After,
    the buffered apply is never sent again, and it is applied exactly once."""
    stamp, slot_dir = leased(toolserver, tmp_path)
    from tools.builtin import write_job

    write_job(
        slot_dir,
        {
            "job_id": "job-A",
            "generation": stamp.generation,
            "test_command": ["/bin/true"],
            "test_timeout_s": 30,
        },
    )
    proxy = FaultProxy(toolserver.url)
    rule = proxy.add(Rule("status_429", "/v1/tools/run_tests", retry_after_s=1))
    url = proxy.start()
    client = ToolClient(url, timeout_s=10)
    try:
        apply = client.call(
            envelope(stamp, "apply_patch", "job-A:s1:apply"),
            {"patch": PATCH},
            slot_dir=slot_dir,
            deadline_s=30,
        )
        tests = client.call(
            envelope(stamp, "run_tests", "job-A:s2:tests"), {}, slot_dir=slot_dir, deadline_s=30
        )
    finally:
        client.close()
        proxy.stop()
    assert apply.receipt is not None and apply.receipt["status"] == "applied"
    assert rule.fired == 1
    assert client.decisions["retry_only_with_receipt"] == 1
    assert tests.result["passed"] is True
    assert receipt_statuses(slot_dir, "job-A:s1:apply") == ["intent", "applied"]
    assert len(applied_lines(toolserver, "job-A:s1:apply")) == 1
    assert len(applied_lines(toolserver, "job-A:s2:tests")) == 1
    # The patch is in the tree once: reversing it once brings back the base.
    check = subprocess.run(
        ["git", "apply", "--check", "--reverse", "-"],
        cwd=slot_dir / "work",
        input=PATCH.encode(),
        capture_output=True,
    )
    assert check.returncode == 0


def test_5xx_on_a_mutating_call_goes_to_the_receipt_store(
    toolserver: ToolServer, tmp_path: Path
) -> None:
    """A 503 on write_file is not retried blindly: reconcile finds no receipt, resends once
    with the same key, and the file is written once."""
    stamp, slot_dir = leased(toolserver, tmp_path)
    proxy = FaultProxy(toolserver.url)
    proxy.add(Rule("status_503", "/v1/tools/write_file"))
    url = proxy.start()
    client = ToolClient(url, timeout_s=10)
    try:
        response = client.call(
            envelope(stamp, "write_file", "job-A:5xx"),
            {"path": "a.txt", "content": "x"},
            slot_dir=slot_dir,
            deadline_s=30,
        )
    finally:
        client.close()
        proxy.stop()
    assert client.decisions["reconcile"] == 1 and client.decisions["resend_after_reconcile"] == 1
    assert response.receipt is not None and response.receipt["status"] == "applied"
    assert receipt_statuses(slot_dir, "job-A:5xx") == ["intent", "applied"]


def test_read_timeout_on_read_file_is_retried_once(toolserver: ToolServer, tmp_path: Path) -> None:
    """A slow reply to read_file times out and is retried once (retry_once), then succeeds."""
    stamp, slot_dir = leased(toolserver, tmp_path)
    proxy = FaultProxy(toolserver.url)
    proxy.add(Rule("delay", "/v1/tools/read_file", delay_s=3.0))
    url = proxy.start()
    client = ToolClient(url, timeout_s=1.0)
    try:
        response = client.call(
            envelope(stamp, "read_file", None),
            {"path": "pkg/lock.py"},
            slot_dir=slot_dir,
            deadline_s=30,
        )
    finally:
        client.close()
        proxy.stop()
    assert client.decisions["retry_once"] == 1
    assert response.result["content"] == "held_by = None\n"


@pytest.fixture
def faulty(settings: Any, tmp_path: Path) -> Iterator[tuple[ToolServer, FaultPlan]]:
    """A real tool server built with a fault plan's fsync (``ops.testing.toolserver``)."""
    server = ToolServer(settings, tmp_path / "logs", faults=True)
    assert server.faults is not None
    try:
        yield server, server.faults
    finally:
        server.stop()


def test_fsync_failure_poisons_the_slot_and_nothing_more_is_applied(
    faulty: tuple[ToolServer, FaultPlan], tmp_path: Path
) -> None:
    """A receipt fsync fails (EIO): the call is outcome unknown, a resend of the same key
    is refused slot_poisoned and never runs its effect, and lookups say unknown, not 500."""
    import httpx

    toolserver, faults = faulty
    stamp, slot_dir = leased(toolserver, tmp_path)
    faults.arm_fsync_eio(slot_dir)
    body = {
        "envelope": envelope(stamp, "write_file", "job-A:eio").model_dump(),
        "args": {"path": "eio.txt", "content": "x"},
    }
    url = f"{toolserver.url}/v1/tools/write_file"
    first = httpx.post(url, json=body, timeout=30)
    assert first.status_code == 500 and first.json()["error"] == "outcome_unknown"
    again = httpx.post(url, json=body, timeout=30)
    assert again.status_code == 409 and again.json()["error"] == "slot_poisoned"
    assert not (slot_dir / "work" / "eio.txt").exists()
    lookup = httpx.get(f"{toolserver.url}/v1/receipts/job-A:eio", params={"slot": stamp.slot_id})
    assert lookup.status_code in (404, 503)
    read = httpx.post(
        f"{toolserver.url}/v1/tools/read_file",
        timeout=30,
        json={
            "envelope": envelope(stamp, "read_file", None).model_dump(),
            "args": {"path": "README"},
        },
    )
    assert read.status_code in (200, 409)  # reads are harmless; the stamp may be poisoned


def test_a_failed_receipt_lookup_says_why() -> None:
    """The job's reason names the server's error, not only its status code."""
    import httpx

    from tools.client import _why

    said = httpx.Response(503, json={"error": "outcome_unknown", "message": "fsync failed"})
    assert _why(said) == ": outcome_unknown: fsync failed"
    assert _why(httpx.Response(500, text="Internal Server Error")) == ""
    assert _why(httpx.Response(502, json=["not", "a", "dict"])) == ""
