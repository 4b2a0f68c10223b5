"""The tool server on a real port: the replay of docs/architecture.md §Problem, receipts,
refusals, bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer

LOCK_PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root (outside .git) with its bytes: 'byte-identical' made checkable."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(root).parts:
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


class Slots:
    def __init__(self, settings: Settings, repo: Path, base: str) -> None:
        client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
        self.settings = settings
        self.pool = SlotPool(settings, client, EventLog(settings))
        self.workspaces = Workspaces(settings.home)
        self.repo, self.base = repo, base

    def lease(self, job_id: str) -> Stamp:
        stamp = self.pool.lease(job_id, 1)
        self.workspaces.prepare(
            self.settings.slots_dir / stamp.slot_id, str(self.repo), self.base, job_id
        )
        return stamp

    def work(self, stamp: Stamp) -> Path:
        return self.settings.slots_dir / stamp.slot_id / "work"


@pytest.fixture
def slots(toolserver: ToolServer, tmp_path: Path) -> Slots:
    repo = tmp_path / "repo"
    base = make_repo(repo)
    return Slots(toolserver.settings.with_(slots=1), repo, base)


def envelope(stamp: Stamp, tool: str, key: str | None) -> dict[str, Any]:
    return {
        "job_id": stamp.job_id,
        "attempt": stamp.attempt,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
        "tool": tool,
        "idempotency_key": key,
    }


def post(server: ToolServer, tool: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/tools/{tool}", json=body, timeout=30)


def log_lines(settings: Settings) -> list[dict[str, Any]]:
    return [json.loads(line) for line in settings.log_path.read_text().splitlines()]


def test_a_buffered_replay_into_a_recycled_slot_is_refused(
    toolserver: ToolServer, slots: Slots
) -> None:
    """A's buffered apply replayed after S7 was recycled to B is refused; B's tree untouched."""
    a = slots.lease("job-A")
    body = {
        "envelope": envelope(a, "apply_patch", "job-A:apply:pkg/lock.py:1"),
        "args": {"patch": LOCK_PATCH},
    }
    first = post(toolserver, "apply_patch", body)
    assert first.status_code == 200 and first.json()["receipt"]["status"] == "applied"
    slots.pool.release(a.slot_id, "job-A", a.generation)
    b = slots.lease("job-B")
    assert (b.slot_id, b.generation) == (a.slot_id, a.generation + 1)
    before = tree_bytes(slots.work(b))
    replay = post(toolserver, "apply_patch", body)
    assert replay.status_code == 409
    assert replay.json()["error"] in ("stale_generation", "slot_job_mismatch")
    assert tree_bytes(slots.work(b)) == before
    refused = [
        line
        for line in log_lines(toolserver.settings)
        if line["event"] == "tool_result" and line["outcome"] == "refused"
    ]
    assert (
        refused
        and refused[-1]["job_id"] == "job-A"
        and refused[-1]["slot_generation"] == a.generation
    )
    assert refused[-1]["reason"] in ("stale_generation", "slot_job_mismatch")
    assert refused[-1]["http_status"] == 409


def test_receipt_on_disk_before_reply_and_replay_is_idempotent(
    toolserver: ToolServer, slots: Slots
) -> None:
    """The 200 comes with a receipt already in receipts.jsonl; a replay returns it unchanged."""
    a = slots.lease("job-A")
    body = {
        "envelope": envelope(a, "write_file", "k-write-1"),
        "args": {"path": "notes.txt", "content": "one\n"},
    }
    first = post(toolserver, "write_file", body)
    assert first.status_code == 200
    receipts = (slots.settings.slots_dir / a.slot_id / "receipts.jsonl").read_text().splitlines()
    statuses = [
        json.loads(line)["status"] for line in receipts if json.loads(line)["key"] == "k-write-1"
    ]
    assert statuses == ["intent", "applied"]
    target = slots.work(a) / "notes.txt"
    stat_before = target.stat()
    # Change the file by hand: a replay must not rewrite it.
    target.write_text("edited later\n")
    second = post(toolserver, "write_file", body)
    assert second.status_code == 200
    assert second.json()["replayed"] is True
    assert second.json()["receipt"] == first.json()["receipt"]
    assert target.read_text() == "edited later\n"
    assert stat_before.st_ino == target.stat().st_ino
    lines = (slots.settings.slots_dir / a.slot_id / "receipts.jsonl").read_text().splitlines()
    assert len(lines) == len(receipts)


def test_receipt_lookup_endpoint(toolserver: ToolServer, slots: Slots) -> None:
    """GET /v1/receipts/{key}?slot= answers 200 with the receipt, 404 for an unknown key."""
    a = slots.lease("job-A")
    post(
        toolserver,
        "write_file",
        {"envelope": envelope(a, "write_file", "k1"), "args": {"path": "a.txt", "content": "x"}},
    )
    found = httpx.get(f"{toolserver.url}/v1/receipts/k1", params={"slot": a.slot_id})
    assert (
        found.status_code == 200
        and found.json()["receipt"]["digest"] == hashlib.sha256(b"x").hexdigest()
    )
    missing = httpx.get(f"{toolserver.url}/v1/receipts/nope", params={"slot": a.slot_id})
    assert missing.status_code == 404


@pytest.mark.parametrize("key", ["a/b", "q?x=1#f", "50%", "line\nbreak", "ünï cödé"])
def test_a_key_of_any_text_can_be_looked_up(toolserver: ToolServer, slots: Slots, key: str) -> None:
    """A key is any text (#15): quoted as a path segment, as the client sends it, its
    receipt is found, and a key never reaches the route of another path."""
    from urllib.parse import quote

    from tools.client import ToolClient
    from tools.envelope import Envelope

    a = slots.lease("job-A")
    body = {"envelope": envelope(a, "write_file", key), "args": {"path": "a.txt", "content": "x"}}
    assert post(toolserver, "write_file", body).status_code == 200
    url = f"{toolserver.url}/v1/receipts/{quote(key, safe='')}"
    found = httpx.get(url, params={"slot": a.slot_id})
    assert found.status_code == 200 and found.json()["receipt"]["key"] == key
    client = ToolClient(toolserver.url)
    try:
        reconciled = client._lookup(Envelope.model_validate(body["envelope"]))
    finally:
        client.http.close()
    assert reconciled is not None and reconciled.receipt is not None
    assert reconciled.receipt["key"] == key


def test_a_key_names_one_call_never_another_tools(toolserver: ToolServer, slots: Slots) -> None:
    """A key that has a write_file's receipt, sent again with rm, is refused 422 and the
    file stays: never answered with the write's receipt as if rm had run (#15)."""
    a = slots.lease("job-A")
    write = {"envelope": envelope(a, "write_file", "k1"), "args": {"path": "a.txt", "content": "x"}}
    assert post(toolserver, "write_file", write).status_code == 200
    rm = post(toolserver, "rm", {"envelope": envelope(a, "rm", "k1"), "args": {"path": "a.txt"}})
    assert rm.status_code == 422 and rm.json()["error"] == "malformed", rm.text
    assert "write_file" in rm.json()["message"]
    assert (slots.work(a) / "a.txt").read_bytes() == b"x"
    again = post(toolserver, "write_file", write)
    assert again.status_code == 200 and again.json()["replayed"] is True


@pytest.mark.parametrize(
    "path",
    [
        "../escape.txt",
        "/etc/passwd-x",
        ".git/hooks/pre-commit",
        "a/../../escape.txt",
        "link-out/evil.txt",
    ],
)
def test_hostile_paths_are_refused_403(
    toolserver: ToolServer, slots: Slots, tmp_path: Path, path: str
) -> None:
    """Paths that leave the tree get 403 outside_workspace and nothing is written anywhere."""
    a = slots.lease("job-A")
    work = slots.work(a)
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "link-out").symlink_to(outside)
    before_outside = tree_bytes(tmp_path)
    response = post(
        toolserver,
        "write_file",
        {
            "envelope": envelope(a, "write_file", f"k-{path}"),
            "args": {"path": path, "content": "pwned"},
        },
    )
    assert response.status_code == 403
    assert response.json()["error"] == "outside_workspace"
    after = tree_bytes(tmp_path)
    # Only the server's own bookkeeping may change (log and receipts), never a file with our bytes.
    assert not any(content == b"pwned" for content in after.values())
    assert {k: v for k, v in after.items() if "outside" in k} == {
        k: v for k, v in before_outside.items() if "outside" in k
    }


def test_unknown_tool_is_404_with_message(toolserver: ToolServer, slots: Slots) -> None:
    """An unknown tool is answered 404 unknown_tool with the list of known tools."""
    a = slots.lease("job-A")
    response = post(
        toolserver, "format_disk", {"envelope": envelope(a, "format_disk", "k"), "args": {}}
    )
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_tool" and "write_file" in response.json()["message"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"envelope": {"job_id": "x"}, "args": {}}, "attempt"),
        ({"args": {}}, "envelope"),
        ({"envelope": None, "args": {"path": "a"}, "extra": 1}, "body must be"),
    ],
)
def test_malformed_requests_are_422(
    toolserver: ToolServer, slots: Slots, body: Any, needle: str
) -> None:
    """A malformed body is a 422 whose message names the problem."""
    response = post(toolserver, "write_file", body)
    assert response.status_code == 422
    assert needle in response.json()["message"]


def test_non_json_body_is_422(toolserver: ToolServer) -> None:
    """A body that is not JSON is a 422, not a crash."""
    response = httpx.post(f"{toolserver.url}/v1/tools/write_file", content=b"\xff\x00garbage")
    assert response.status_code == 422


def test_bad_args_are_422(toolserver: ToolServer, slots: Slots) -> None:
    """Arguments that do not fit the tool's model are refused before anything is recorded."""
    a = slots.lease("job-A")
    response = post(
        toolserver,
        "write_file",
        {"envelope": envelope(a, "write_file", "k"), "args": {"path": "a.txt"}},
    )
    assert response.status_code == 422 and "content" in response.json()["message"]
    assert not (slots.settings.slots_dir / a.slot_id / "receipts.jsonl").exists()


def test_patch_that_does_not_apply_leaves_failed_receipt(
    toolserver: ToolServer, slots: Slots
) -> None:
    """A patch that does not apply: receipt 'failed', tree unchanged, the failure explained."""
    a = slots.lease("job-A")
    before = tree_bytes(slots.work(a))
    bad = LOCK_PATCH.replace("-held_by = None", "-held_by = 42")
    response = post(
        toolserver,
        "apply_patch",
        {"envelope": envelope(a, "apply_patch", "k-bad"), "args": {"patch": bad}},
    )
    assert response.status_code == 200
    receipt = response.json()["receipt"]
    assert receipt["status"] == "failed" and "does not apply" in receipt["detail"]
    assert tree_bytes(slots.work(a)) == before


def test_mutating_call_without_key_is_refused(toolserver: ToolServer, slots: Slots) -> None:
    """A mutating call without an idempotency key is refused 409 missing_idempotency_key."""
    a = slots.lease("job-A")
    response = post(
        toolserver,
        "write_file",
        {"envelope": envelope(a, "write_file", None), "args": {"path": "a.txt", "content": "x"}},
    )
    assert response.status_code == 409 and response.json()["error"] == "missing_idempotency_key"
    assert not (slots.work(a) / "a.txt").exists()


def test_log_line_has_the_design_fields(toolserver: ToolServer, slots: Slots) -> None:
    """Every tool_result line carries exactly the fields the detector relies on."""
    from runner.core import events

    a = slots.lease("job-A")
    post(
        toolserver,
        "write_file",
        {"envelope": envelope(a, "write_file", "k-log"), "args": {"path": "a.txt", "content": "x"}},
    )
    line = [entry for entry in log_lines(toolserver.settings) if entry["event"] == "tool_result"][
        -1
    ]
    assert set(events.COMMON_FIELDS) | set(events.TOOL_RESULT_FIELDS) <= set(line)
    assert line["outcome"] == "applied" and line["receipt_job"] == "job-A"
    assert line["receipt_generation"] == a.generation and line["http_status"] == 200
