"""The workspace handle of runner.agent.api against a real tool server, real leases from
the real slot pool, real git trees and real Redis: its methods, its refusals, a stale
handle, its OpenAI schemas and its deterministic keys."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.testing.fault_proxy import FaultProxy, Rule
from runner.agent.api import Workspace, WorkspaceCallError, WorkspaceOutcomeUnknown
from runner.agent.function import run_function
from runner.agent.loop import AgentRun, idempotency_key
from runner.core import events
from runner.core.logs import EventLog
from runner.jobs.models import JobSpec
from runner.slots.pool import Lease, SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.receipts import slot_receipts
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools import registry
from tools.builtin import write_job
from tools.client import ToolClient

PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""


class Host:
    """This test's slots, leased from the real pool, and handles over them."""

    def __init__(self, server: ToolServer, tmp_path: Path) -> None:
        self.settings = server.settings
        client = redis.Redis.from_url(self.settings.redis_url or "", decode_responses=True)
        self.pool = SlotPool(self.settings, client, EventLog(self.settings))
        self.repo = tmp_path / "repo"
        self.base = make_repo(self.repo)
        self.clients: list[ToolClient] = []

    def lease(self, job_id: str, attempt: int = 1, tools: list[str] | None = None) -> Lease:
        lease = self.pool.lease(job_id, attempt, tools=tools)
        slot_dir = self.settings.slots_dir / lease.slot_id
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

    def handle(
        self,
        lease: Lease,
        *,
        tools: list[str] | None = None,
        url: str | None = None,
        should_stop: Callable[[], str | None] | None = None,
    ) -> Workspace:
        assert lease.job_id is not None
        spec = JobSpec.model_validate(
            {
                "job_id": lease.job_id,
                "repo": str(self.repo),
                "planner": {"kind": "python", "entry": "tests.support.agents:write_then_raise"},
                "tools": tools,
            }
        )
        client = ToolClient(url or self.settings.toolserver_url)
        self.clients.append(client)
        slot_dir = self.settings.slots_dir / lease.slot_id
        run = AgentRun(spec, lease, slot_dir, client, should_stop=should_stop)
        return Workspace(run, tools=tools, token=lease.token, mcp_url=lease.mcp_url)

    def work(self, lease: Lease) -> Path:
        return self.settings.slots_dir / lease.slot_id / "work"

    def results(self, job_id: str) -> list[dict[str, Any]]:
        lines = self.settings.log_path.read_text().splitlines()
        return [
            e
            for e in map(json.loads, lines)
            if e["event"] == events.TOOL_RESULT and e["job_id"] == job_id
        ]

    def receipts(self, lease: Lease) -> list[dict[str, Any]]:
        return slot_receipts(self.settings.slots_dir / lease.slot_id)

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def host(toolserver: ToolServer, tmp_path: Path) -> Iterator[Host]:
    made = Host(toolserver, tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_every_tool_is_a_method_through_the_fenced_path(host: Host) -> None:
    """Each method is its tool: its result mapping back, a log line per call, a receipt
    and the job/attempt/step key per mutating call; the lease's token and MCP URL."""
    lease = host.lease("job-A")
    ws = host.handle(lease)
    assert ws.job_id == "job-A" and ws.attempt == 1 and ws.generation == lease.generation
    assert ws.token == lease.token and ws.token and ws.mcp_url == lease.mcp_url
    assert ws.gateway_url is None and ws.tools == tuple(registry.TOOLS)
    assert set(registry.TOOLS) <= set(dir(ws))
    assert ws.read_file(path="pkg/lock.py")["content"] == "held_by = None\n"
    assert ws.apply_patch(patch=PATCH)["files"] == ["pkg/lock.py"]
    assert ws.write_file(path="notes/a.md", content="a\n")["bytes"] == 2
    assert ws.mv(src="notes/a.md", dst="notes/b.md") == {"src": "notes/a.md", "dst": "notes/b.md"}
    assert ws.exec(command="cat notes/b.md; echo made > made.txt")["output"] == "a\n"
    assert ws.rm(path="made.txt")["removed"] is True
    assert ws.run_tests()["passed"] is True
    assert "notes/" in ws.git_status()["status"]
    assert {e["name"] for e in ws.list_dir(path="notes")["entries"]} == {"b.md"}
    assert ws.call("git_commit", '{"message": "by the agent"}')["commit"]
    assert (host.work(lease) / "notes/b.md").read_text() == "a\n"
    steps = ws.steps
    assert [s.index for s in steps] == list(range(10))
    lines = host.results("job-A")
    assert [line["tool"] for line in lines] == [s.tool for s in steps]
    receipts = host.receipts(lease)
    for step in steps:
        if not registry.TOOLS[step.tool].mutating:
            assert step.outcome == "read" and step.idempotency_key is None
            continue
        assert step.outcome == "applied"
        assert step.idempotency_key == idempotency_key("job-A", 1, step.index, step.tool)
        mine = [r["status"] for r in receipts if r["key"] == step.idempotency_key]
        assert mine == ["intent", "applied"]


def test_openai_tools_are_the_registry_s_argument_models(host: Host) -> None:
    """openai_tools(): the allowed tools, in the registry's order, each the schema the
    server validates with and the description MCP gives it."""
    lease = host.lease("job-A")
    for allowed in (None, ["write_file", "read_file", "exec"]):
        tools = host.handle(lease, tools=allowed).openai_tools()
        names = [t["function"]["name"] for t in tools]
        assert names == [n for n in registry.TOOLS if allowed is None or n in allowed]
        for tool in tools:
            assert tool["type"] == "function"
            name = tool["function"]["name"]
            schema = registry.TOOLS[name].args_model.model_json_schema()
            schema.pop("title")
            assert tool["function"]["parameters"] == schema
            assert tool["function"]["description"] == registry.describe(name)
            assert schema["type"] == "object" and schema["additionalProperties"] is False


def test_refused_calls_raise_one_exception_with_the_reason(host: Host) -> None:
    """Unknown tool, a tool outside the job's tools, bad arguments (refused before
    sending), a path outside the tree and a missing file (refused by the server): each
    WorkspaceCallError with its reason, recorded as a refused step, the tree unchanged."""
    lease = host.lease("job-A", tools=["read_file", "write_file"])
    ws = host.handle(lease, tools=["read_file", "write_file"])
    before = sorted(p.name for p in host.work(lease).rglob("*"))
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: ws.call("launch_missiles", {}), "unknown_tool"),
        (lambda: ws.apply_patch(patch=PATCH), "tool_not_allowed"),
        (lambda: ws.call("write_file", {"path": "x.txt"}), "malformed"),
        (lambda: ws.call("write_file", "{not json"), "malformed"),
        (lambda: ws.write_file(path="x", content="x", mode="0777"), "malformed"),
        (lambda: ws.write_file(path="../outside.txt", content="x\n"), "outside_workspace"),
        (lambda: ws.read_file(path="no/such/file"), "not_found"),
    ]
    for attempt, reason in cases:
        with pytest.raises(WorkspaceCallError) as refused:
            attempt()
        assert refused.value.reason == reason, refused.value
        assert not isinstance(refused.value, WorkspaceOutcomeUnknown)
    with pytest.raises(AttributeError):
        ws.launch_missiles  # noqa: B018 - only registered tools are methods
    assert [s.outcome for s in ws.steps] == ["refused"] * len(cases)
    assert sorted(p.name for p in host.work(lease).rglob("*")) == before
    assert not (host.work(lease).parent / "outside.txt").exists()
    # Only the two the server judged reached it; nothing was applied, nor begun.
    lines = host.results("job-A")
    assert [line["outcome"] for line in lines] == ["refused", "failed"]
    assert host.receipts(lease) == []


def test_a_stale_handle_is_refused_and_changes_nothing(host: Host) -> None:
    """The job superseded: its slot leased again to attempt 2 at a new generation. The
    attempt-1 handle's next call raises stale_generation, sends nothing, writes nothing;
    the new attempt's handle works in the same slot."""
    old = host.lease("job-A", attempt=1)
    stale = host.handle(old)
    stale.write_file(path="notes/first.md", content="first\n")
    host.pool.release(old.slot_id, "job-A", old.generation)
    new = host.lease("job-A", attempt=2)
    assert new.slot_id == old.slot_id and new.generation > old.generation
    sent_before = len(host.results("job-A"))
    calls: list[Callable[[], object]] = [
        lambda: stale.write_file(path="notes/late.md", content="late\n"),
        lambda: stale.read_file(path="README"),
        lambda: stale.exec(command="touch late.txt"),
    ]
    for call in calls:
        with pytest.raises(WorkspaceCallError) as refused:
            call()
        assert refused.value.reason == "stale_generation"
    assert not (host.work(new) / "notes/late.md").exists()
    assert not (host.work(new) / "late.txt").exists()
    assert len(host.results("job-A")) == sent_before
    assert stale._run.counts.stale_rejects == 3
    fresh = host.handle(new)
    assert fresh.write_file(path="notes/second.md", content="second\n")["bytes"] == 7
    keys = [r["key"] for r in host.receipts(new) if r["status"] == "applied"]
    assert keys == [
        idempotency_key("job-A", 1, 0, "write_file"),
        idempotency_key("job-A", 2, 0, "write_file"),
    ]


def test_a_stop_closes_the_handle(host: Host) -> None:
    """Told to stop (a newer attempt, a cancel) before a call: that call and every
    later one raise the stop's reason, nothing is sent, and the run records the stop."""
    lease = host.lease("job-A")
    told: list[str] = []
    ws = host.handle(lease, should_stop=lambda: told[0] if told else None)
    ws.write_file(path="a.md", content="a\n")
    told.append("superseded")
    for _ in range(2):
        with pytest.raises(WorkspaceCallError) as refused:
            ws.write_file(path="b.md", content="b\n")
        assert refused.value.reason == "superseded"
    assert ws._run.stopped == "superseded"
    assert not (host.work(lease) / "b.md").exists()
    assert len(host.results("job-A")) == 1


def test_the_runner_closes_the_handle_when_the_function_returns(host: Host) -> None:
    """A handle kept past its function's return is refused (closed); one the function
    raises through is the job's failure, named."""
    lease = host.lease("job-A")
    kept: list[Workspace] = []

    def keeps(ws: Workspace, config: dict[str, Any]) -> None:
        kept.append(ws)
        ws.write_file(path=str(config["path"]), content="x\n")

    ws = host.handle(lease)
    outcome = run_function(
        keeps,
        ws,
        {"path": "kept.md"},
        entry="t:keeps",
        remaining_s=lambda: 60.0,
        stop_reason=lambda: None,
    )
    assert outcome.failure is None and outcome.stopped is None
    with pytest.raises(WorkspaceCallError) as refused:
        kept[0].write_file(path="after.md", content="x\n")
    assert refused.value.reason == "closed"

    def raises(ws: Workspace, config: dict[str, Any]) -> None:
        raise KeyError("missing")

    failed = run_function(
        raises,
        host.handle(lease),
        {},
        entry="t:raises",
        remaining_s=lambda: 60.0,
        stop_reason=lambda: None,
    )
    assert failed.failure == "agent t:raises raised KeyError: 'missing'"


def test_a_resend_after_a_lost_reply_is_recognised(host: Host) -> None:
    """Keys come from (job, attempt, step). A reply lost on the way back is settled from
    the receipt (replayed); one whose receipt lookup fails too raises
    WorkspaceOutcomeUnknown, and the same call again goes under the same key: the server
    answers it replayed, applied once."""
    lease = host.lease("job-A")
    proxy = FaultProxy(host.settings.toolserver_url)
    first = idempotency_key("job-A", 1, 0, "write_file")
    second = idempotency_key("job-A", 1, 1, "write_file")
    proxy.add(Rule("lose_response", "/v1/tools/write_file", key_contains=first))
    proxy.add(Rule("lose_response", "/v1/tools/write_file", key_contains=second))
    proxy.add(Rule("status_503", f"/v1/receipts/{second}", method="GET"))
    url = proxy.start()
    try:
        ws = host.handle(lease, url=url)
        assert ws.write_file(path="a.md", content="a\n")["bytes"] == 2
        with pytest.raises(WorkspaceOutcomeUnknown) as unknown:
            ws.write_file(path="b.md", content="b\n")
        assert unknown.value.reason == "outcome_unknown" and unknown.value.step == 1
        again = ws.write_file(path="b.md", content="b\n")
        after = ws.write_file(path="c.md", content="c\n")
    finally:
        proxy.stop()
    assert again["bytes"] == 2 and after["bytes"] == 2
    assert proxy.stats["lose_response"] == 2 and proxy.stats["status_503"] == 1
    steps = ws.steps
    assert [(s.index, s.outcome) for s in steps] == [
        (0, "replayed"),
        (1, "unknown"),
        (1, "replayed"),
        (2, "applied"),
    ]
    assert steps[1].idempotency_key == steps[2].idempotency_key == second
    receipts = host.receipts(lease)
    for key in (first, second):
        assert [r["status"] for r in receipts if r["key"] == key] == ["intent", "applied"]
    applied = [line for line in host.results("job-A") if line["outcome"] == "applied"]
    assert [line["idempotency_key"] for line in applied] == [
        first,
        second,
        idempotency_key("job-A", 1, 2, "write_file"),
    ]
    assert (host.work(lease) / "b.md").read_text() == "b\n"
