"""The MCP door on the real stack: a real tool server process, real Redis, real bwrap,
the official ``mcp`` client over streamable HTTP, tokens from real leases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from mcp.shared.exceptions import MCPError

from ops.cli import ops
from runner.core import events
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import Lease, SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.mcpclient import mcp_session, text_of
from tests.support.receipts import slot_receipts
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools import registry
from tools.builtin import write_job

PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""
RPC_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


class Host:
    """This test's slots, leased through the real pool and prepared from a real repo."""

    def __init__(self, server: ToolServer, tmp_path: Path) -> None:
        self.settings = server.settings
        client = redis.Redis.from_url(self.settings.redis_url or "", decode_responses=True)
        self.pool = SlotPool(self.settings, client, EventLog(self.settings))
        self.repo = tmp_path / "repo"
        self.base = make_repo(self.repo)

    def lease(self, job_id: str, attempt: int = 1, **options: Any) -> Lease:
        lease = self.pool.lease(job_id, attempt, **options)
        slot_dir = self.slot_dir(lease)
        Workspaces(self.settings.home).prepare(slot_dir, str(self.repo), self.base, job_id)
        write_job(
            slot_dir,
            {
                "job_id": job_id,
                "generation": lease.generation,
                "test_command": ["/bin/sh", "-c", "grep -q A pkg/lock.py"],
                "test_timeout_s": 30,
            },
        )
        return lease

    def slot_dir(self, lease: Lease) -> Path:
        return self.settings.slots_dir / lease.slot_id

    def work(self, lease: Lease) -> Path:
        return self.slot_dir(lease) / "work"

    def results(self) -> list[dict[str, Any]]:
        lines = self.settings.log_path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == events.TOOL_RESULT]

    def receipts(self, lease: Lease) -> list[dict[str, Any]]:
        return slot_receipts(self.slot_dir(lease))


@pytest.fixture
def host(toolserver: ToolServer, tmp_path: Path) -> Host:
    return Host(toolserver, tmp_path)


def post_mcp(url: str, authorization: str | None) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["Authorization"] = authorization
    return httpx.post(url, json=RPC_INIT, headers=headers, timeout=30)


def test_the_official_client_lists_and_calls_every_tool(host: Host) -> None:
    """Each applied call has its receipt and one log line; a replayed key runs nothing."""
    lease = host.lease("job-A")
    work = host.work(lease)
    with mcp_session(lease.mcp_url, lease.token) as mcp:
        listed = {tool.name: tool for tool in mcp.tools()}
        assert list(listed) == list(registry.TOOLS)
        for name, tool in listed.items():
            schema = registry.TOOLS[name].args_model.model_json_schema()
            assert tool.input_schema == {k: v for k, v in schema.items() if k != "title"}
            assert tool.description == registry.DESCRIPTIONS[name]
        calls = [
            ("write_file", {"path": "notes/a.txt", "content": "one\n"}, "k-write"),
            ("apply_patch", {"patch": PATCH}, "k-patch"),
            ("run_tests", {}, "k-tests"),
            ("exec", {"command": "cat notes/a.txt; echo made > made.txt"}, "k-exec"),
            ("read_file", {"path": "notes/a.txt"}, None),
        ]
        results = {name: mcp.call(name, args, key) for name, args, key in calls}
        replay = mcp.call("write_file", {"path": "notes/a.txt", "content": "two\n"}, "k-write")
        rerun = mcp.call("exec", {"command": "echo again > made.txt"}, "k-exec")
        mcp.call("write_file", {"path": "notes/b.txt", "content": "b\n"})
    for name, result in results.items():
        assert not result.is_error, (name, text_of(result))
    assert results["read_file"].structured_content["result"]["content"] == "one\n"
    assert results["run_tests"].structured_content["result"]["exit_code"] == 0
    assert results["run_tests"].structured_content["result"]["sandbox"] == "bwrap"
    ran = results["exec"].structured_content["result"]
    assert ran["exit_code"] == 0 and "one" in ran["output"] and ran["sandbox"] == "bwrap"
    assert (work / "made.txt").read_text() == "made\n"
    assert (work / "pkg/lock.py").read_text() == 'held_by = "A"\n'
    # The replay answers from the receipt, says so in both forms, and writes nothing.
    assert not replay.is_error and replay.structured_content["replayed"] is True
    assert json.loads(text_of(replay))["replayed"] is True
    assert (work / "notes/a.txt").read_text() == "one\n"
    assert (
        rerun.structured_content["replayed"] is True and rerun.structured_content["result"] == ran
    )
    assert (work / "made.txt").read_text() == "made\n"

    lines = host.results()
    assert len(lines) == len(calls) + 3  # one line per call, replays and reads included
    minted = lines[-1]["idempotency_key"]
    assert minted.startswith("mcp-") and (work / "notes/b.txt").read_text() == "b\n"
    receipts = host.receipts(lease)
    for key in ("k-write", "k-patch", "k-tests", "k-exec", minted):
        applied = [line for line in lines if line["idempotency_key"] == key]
        assert [line["outcome"] for line in applied] == (
            ["applied", "replayed"] if key in ("k-write", "k-exec") else ["applied"]
        )
        on_disk = [r["status"] for r in receipts if r["key"] == key]
        assert on_disk == ["intent", "applied"], (key, on_disk)
        assert applied[0]["job_id"] == "job-A" and applied[0]["slot_generation"] == lease.generation
    log = str(host.settings.log_path)
    for verb in ("verify", "detect"):
        checked = CliRunner().invoke(ops, [verb, log])
        assert checked.exit_code == 0, (verb, checked.output)


def test_a_token_dies_with_its_lease_and_never_reaches_another_slot(host: Host) -> None:
    """Released, recycled, expired: refused with the envelope's reason, nothing changed;
    A's token sees only A's tree; no token or a forged one is 401 before MCP runs."""
    a, b = host.lease("job-A"), host.lease("job-B")
    assert a.slot_id != b.slot_id
    (host.work(b) / "only_b.txt").write_text("b\n")
    with mcp_session(a.mcp_url, a.token) as mcp:
        assert mcp.call("read_file", {"path": "only_b.txt"}).is_error
        assert not mcp.call("write_file", {"path": "from_a.txt", "content": "a\n"}, "k-a").is_error
    assert (host.work(a) / "from_a.txt").exists() and not (host.work(b) / "from_a.txt").exists()

    before = len(host.results())
    secret = a.token.rsplit(".", 1)[1]
    forged = [
        None,
        "Bearer nonsense",
        f"Bearer slr.{b.slot_id}.{b.generation}.{secret}",  # A's secret, B's name
        f"Bearer {a.token}x",
        f"Basic {a.token}",
    ]
    for authorization in forged:
        answer = post_mcp(a.mcp_url, authorization)
        assert answer.status_code == 401, authorization
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.json()["error"]["message"].startswith("unauthorized")
    with pytest.raises(BaseExceptionGroup) as caught, mcp_session(a.mcp_url, "slr.S0.1.x"):
        pass
    assert caught.group_contains(MCPError, match="unauthorized", depth=None)
    assert len(host.results()) == before  # nothing ran, nothing was logged

    def refusals(token: str, expected: str) -> None:
        with mcp_session(a.mcp_url, token) as mcp:
            for tool, args in (
                ("write_file", {"path": "late.txt", "content": "late\n"}),
                ("read_file", {"path": "from_a.txt"}),
                ("exec", {"command": "echo late > late.txt"}),
            ):
                result = mcp.call(tool, args, f"k-late-{expected}-{tool}")
                assert result.is_error and text_of(result).startswith(f"{expected}: "), tool
                assert result.structured_content["error"] == expected

    host.pool.release(a.slot_id, "job-A", a.generation)
    refusals(a.token, "slot_job_mismatch")  # released: the slot is nobody's
    retry = host.lease("job-A", attempt=2)  # the same job's next attempt supersedes it
    assert retry.slot_id == a.slot_id and retry.generation == a.generation + 1
    refusals(a.token, "stale_generation")
    host.pool.release(retry.slot_id, "job-A", retry.generation)
    c = host.lease("job-C")  # recycled to another job
    assert c.slot_id == a.slot_id
    refusals(a.token, "slot_job_mismatch")
    refusals(retry.token, "slot_job_mismatch")
    assert not (host.work(c) / "late.txt").exists()
    assert not [r for r in host.receipts(c) if r["key"].startswith("k-late")]
    host.pool.release(b.slot_id, "job-B", b.generation)
    d = host.lease("job-D", ttl_s=0.001)
    refusals(d.token, "lease_expired")
    assert not (host.work(d) / "late.txt").exists()
    late = [e for e in host.results() if (e["idempotency_key"] or "").startswith("k-late")]
    assert len(late) == 15 and {line["outcome"] for line in late} == {"refused"}


def test_tools_outside_the_lease_are_refused_on_both_doors(
    settings: Settings, tmp_path: Path
) -> None:
    """tools/list shows only the lease's tools; a call of another is tool_not_allowed, 403
    on the HTTP API, logged and counted as a refusal by both doors alike. With a server
    token set, the HTTP API needs it and the MCP door the lease token alone."""
    server = ToolServer(settings, tmp_path / "logs", SLOTRUNNER_TOKEN="server-secret")
    try:
        _narrowed(Host(server, tmp_path))
    finally:
        server.stop()


def _narrowed(host: Host) -> None:
    lease = host.lease("job-A", tools=["read_file", "write_file"])
    assert post_mcp(lease.mcp_url, "Bearer server-secret").status_code == 401
    with mcp_session(lease.mcp_url, lease.token) as mcp:
        assert sorted(tool.name for tool in mcp.tools()) == ["read_file", "write_file"]
        by_mcp = mcp.call("apply_patch", {"patch": PATCH}, "k-mcp")
        assert not mcp.call("write_file", {"path": "ok.txt", "content": "ok\n"}, "k-ok").is_error
    assert by_mcp.is_error and text_of(by_mcp).startswith("tool_not_allowed: ")
    envelope = {
        "job_id": "job-A",
        "attempt": 1,
        "slot_id": lease.slot_id,
        "generation": lease.generation,
        "tool": "apply_patch",
        "idempotency_key": "k-http",
    }
    url, body = host.settings.toolserver_url, {"envelope": envelope, "args": {"patch": PATCH}}
    assert httpx.post(f"{url}/v1/tools/apply_patch", json=body).status_code == 401
    server_token = {"x-slotrunner-token": "server-secret"}
    by_http = httpx.post(f"{url}/v1/tools/apply_patch", json=body, headers=server_token)
    assert by_http.status_code == 403 and by_http.json()["error"] == "tool_not_allowed"
    assert (host.work(lease) / "pkg/lock.py").read_text() == "held_by = None\n"
    refused = [line for line in host.results() if line["outcome"] == "refused"]
    assert [line["idempotency_key"] for line in refused] == ["k-mcp", "k-http"]
    shapes = [
        {k: v for k, v in line.items() if k not in ("ts", "idempotency_key")} for line in refused
    ]
    for shape in shapes:
        shape["queue_wait_ms"] = shape["service_ms"] = 0
    assert shapes[0] == shapes[1] and shapes[0]["reason"] == "tool_not_allowed"
    assert shapes[0]["http_status"] == 403
    metrics = httpx.get(f"{url}/metrics", headers=server_token).text
    assert 'slotrunner_refusals_total{reason="tool_not_allowed"} 2.0' in metrics
    assert not [r for r in host.receipts(lease) if r["key"] in ("k-mcp", "k-http")]
