"""The two tool-server faults the campaign arms at runtime: a crash marker, a failed fsync."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import redis

from runner.core.durable import FAIL_FSYNC_MARKER
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import SlotState, Stamp, read_stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.client import ToolClient, ToolResponse
from tools.envelope import Envelope
from tools.server.service import CRASH_MARKER


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


def test_crash_marker_kills_the_server_after_the_named_call(
    settings: Settings, tmp_path: Path
) -> None:
    """The marker fires on the call whose key it names, after the effect, once; on restart
    the intent resolves from the tree and the caller's reconcile gets the receipt."""
    server = ToolServer(settings, tmp_path / "logs")
    try:
        stamp, slot_dir = leased(server, tmp_path)
        marker = server.settings.home / CRASH_MARKER
        marker.parent.mkdir(parents=True)
        marker.write_text("job-A:crash-me")
        client = ToolClient(server.url, timeout_s=10)
        other = client.call(
            envelope(stamp, "job-A:other"), {"path": "a.txt", "content": "a"}, slot_dir=slot_dir
        )
        assert other.receipt is not None and marker.exists()
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
        assert not marker.exists()  # consumed: the restarted server does not crash again
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
    toolserver: ToolServer, tmp_path: Path
) -> None:
    """EIO on the receipt fsync: a JSON outcome_unknown (never a bare 500) even when the
    stamp cannot be written either; the next mutating call poisons the slot and is
    refused before any effect, and so is every one after it."""
    stamp, slot_dir = leased(toolserver, tmp_path)
    url = f"{toolserver.url}/v1/tools/write_file"
    body = {
        "envelope": envelope(stamp, "job-A:fsync").model_dump(),
        "args": {"path": "c.txt", "content": "c"},
    }
    (slot_dir / FAIL_FSYNC_MARKER).touch()
    first = httpx.post(url, json=body, timeout=30)
    (slot_dir / FAIL_FSYNC_MARKER).unlink()
    assert first.status_code == 500 and first.json()["error"] == "outcome_unknown"
    assert "could not be written either" in first.json()["message"]
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
