"""The two tool-server faults the campaign arms at run time through the stack's fault plan
(``ops.testing.faultplan``): a crash after a call's effect, a failed fsync."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import redis

from ops.testing.faultplan import FaultPlan
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import SlotState, Stamp, read_stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.client import ToolClient, ToolResponse
from tools.envelope import Envelope


def leased(server: ToolServer, tmp_path: Path) -> tuple[Stamp, Path]:
    settings = server.settings
    repo = tmp_path / "repo"
    base = make_repo(repo)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    stamp = SlotPool(settings, client, EventLog(settings)).lease("job-A", 1)
    client.close()
    slot_dir = settings.slots_dir / stamp.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, "job-A")
    return stamp, slot_dir


def envelope(stamp: Stamp, key: str) -> Envelope:
    return Envelope(
        job_id="job-A",
        attempt=1,
        slot_id=stamp.slot_id,
        generation=stamp.generation,
        tool="write_file",
        idempotency_key=key,
    )


def statuses(slot_dir: Path, key: str) -> list[str]:
    path = slot_dir / "receipts.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["status"] for line in lines if json.loads(line)["key"] == key]


def test_an_armed_crash_kills_the_server_after_the_named_call(
    settings: Settings, tmp_path: Path
) -> None:
    """The crash fires on the call whose key it names, after the effect, once; on restart
    the intent resolves from the tree and the caller's reconcile gets the receipt."""
    server = ToolServer(settings, tmp_path / "logs", faults=True)
    faults = server.faults
    assert faults is not None
    try:
        stamp, slot_dir = leased(server, tmp_path)
        faults.arm_crash(key_contains="job-A:crash-me")
        client = ToolClient(server.url, timeout_s=10)
        other = client.call(
            envelope(stamp, "job-A:other"), {"path": "a.txt", "content": "a"}, slot_dir=slot_dir
        )
        assert other.receipt is not None and faults.crash_armed()
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["response"] = client.call(
                    envelope(stamp, "job-A:crash-me"),
                    {"path": "b.txt", "content": "b"},
                    slot_dir=slot_dir,
                    deadline_s=60,
                )
            except Exception as exc:  # surfaced by the assertions below
                outcome["error"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        assert server.child is not None
        server.child.proc.wait(timeout=30)
        assert server.child.proc.returncode == -9
        assert not faults.crash_armed()  # consumed: the restarted server does not crash again
        assert statuses(slot_dir, "job-A:crash-me") == ["intent"]
        server.stop()
        server.start()
        thread.join(timeout=60)
        assert "error" not in outcome, outcome.get("error")
        response: ToolResponse = outcome["response"]
        assert response.reconciled and response.receipt is not None
        assert statuses(slot_dir, "job-A:crash-me") == ["intent", "applied"]
        assert (slot_dir / "work" / "b.txt").read_text() == "b"
        client.close()
    finally:
        server.stop()


def test_failed_fsync_is_outcome_unknown_and_poisons_the_slot(
    settings: Settings, tmp_path: Path
) -> None:
    """EIO on the receipt fsync: a JSON outcome_unknown (never a bare 500) even when the
    stamp cannot be made durable either; the stamp is written all the same, so the next
    mutating call, after a server restart too, is refused before any effect, and so is
    every one after it."""
    toolserver = ToolServer(settings, tmp_path / "logs", faults=True)
    faults = toolserver.faults
    assert faults is not None
    try:
        _poisoned_by_a_failed_fsync(toolserver, faults, tmp_path)
    finally:
        toolserver.stop()


def _poisoned_by_a_failed_fsync(toolserver: ToolServer, faults: FaultPlan, tmp_path: Path) -> None:
    stamp, slot_dir = leased(toolserver, tmp_path)
    url = f"{toolserver.url}/v1/tools/write_file"
    body = {
        "envelope": envelope(stamp, "job-A:fsync").model_dump(),
        "args": {"path": "c.txt", "content": "c"},
    }
    faults.arm_fsync_eio(slot_dir)
    first = httpx.post(url, json=body, timeout=30)
    faults.disarm_fsync_eio(slot_dir)
    assert first.status_code == 500 and first.json()["error"] == "outcome_unknown"
    assert "could not be written either" in first.json()["message"]
    # Written all the same, though not durably: a server restarted now still knows.
    marked = read_stamp(slot_dir)
    assert marked is not None and marked.state == SlotState.POISONED
    toolserver.stop()
    toolserver.start()
    second = httpx.post(url, json=body, timeout=30)
    assert second.status_code == 409 and second.json()["error"] == "slot_poisoned"
    assert not (slot_dir / "work" / "c.txt").exists()
    poisoned = read_stamp(slot_dir)
    assert poisoned is not None and poisoned.state == SlotState.POISONED
    assert poisoned.reason and "receipt" in poisoned.reason
    third = httpx.post(url, json=body, timeout=30)
    assert third.status_code == 409 and third.json()["error"] == "slot_poisoned"
    # At most the intent whose fsync failed (none if the file's creation failed first);
    # nothing was written after the EIO.
    assert statuses(slot_dir, "job-A:fsync") in ([], ["intent"])


def test_a_normally_started_server_has_no_test_switch(settings: Settings, tmp_path: Path) -> None:
    """``slotrunner toolserver`` ignores the old switches: the variables that turned the
    fence off and armed a crash, and the marker files for EIO and a crash; it applies the
    owner's call durably, refuses a foreign envelope, and stays up."""
    server = ToolServer(
        settings,
        tmp_path / "logs",
        SLOTRUNNER_TEST_DISABLE_ENVELOPE_HOOK="1",
        SLOTRUNNER_TEST_CRASH_AT="after_effect:*",
    )
    try:
        stamp, slot_dir = leased(server, tmp_path)
        (slot_dir / ".fail-fsync").touch()
        (server.settings.home / "chaos").mkdir(exist_ok=True)
        (server.settings.home / "chaos" / "crash-after-effect").write_text("")
        url = f"{server.url}/v1/tools/write_file"
        mine = {
            "envelope": envelope(stamp, "job-A:mine").model_dump(),
            "args": {"path": "mine.txt", "content": "A"},
        }
        applied = httpx.post(url, json=mine, timeout=30)
        assert applied.status_code == 200, applied.text
        assert applied.json()["receipt"]["status"] == "applied"
        assert statuses(slot_dir, "job-A:mine") == ["intent", "applied"]
        foreign = envelope(stamp, "job-B:theirs").model_copy(update={"job_id": "job-B"})
        body = {"envelope": foreign.model_dump(), "args": {"path": "b.txt", "content": "B"}}
        stale = httpx.post(url, json=body, timeout=30)
        assert stale.status_code == 409 and stale.json()["error"] == "slot_job_mismatch"
        assert not (slot_dir / "work" / "b.txt").exists()
        assert server.child is not None and server.child.alive()
    finally:
        server.stop()
