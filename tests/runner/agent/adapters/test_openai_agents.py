"""The OpenAI Agents SDK adapter in this process against a real tool server and real
leases: a refusal the model can read, one that ends the run; its keys, timeouts and
the step each MCP result becomes. The Celery path is tests/e2e/test_openai_agents.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from runner.agent.adapters import mcp_steps
from runner.agent.adapters.openai_agents import CallKeys, OpenAIAgentsConfig, run, session_timeout_s
from runner.agent.api import Workspace, WorkspaceCallError
from runner.agent.loop import AgentRun
from runner.core.logs import EventLog
from runner.jobs.models import Counts, JobSpec
from runner.slots.pool import Lease, SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.builtin import write_job
from tools.client import ToolClient
from tools.envelope import KEY_MAX_CHARS

ENTRY = "runner.agent.adapters.openai_agents:run"


@pytest.fixture
def leased(toolserver: ToolServer, tmp_path: Path) -> Iterator[tuple[SlotPool, Lease, Workspace]]:
    """A workspace handle over a real lease of job ``sdk-local-1``, its tree prepared."""
    settings = toolserver.settings
    pool = SlotPool(
        settings,
        redis.Redis.from_url(settings.redis_url or "", decode_responses=True),
        EventLog(settings),
    )
    repo = tmp_path / "repo"
    base = make_repo(repo, {"pkg/__init__.py": "", "README": "sample\n"})
    lease = pool.lease("sdk-local-1", 1)
    slot_dir = settings.slots_dir / lease.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, "sdk-local-1")
    write_job(slot_dir, {"job_id": "sdk-local-1", "generation": lease.generation})
    spec = JobSpec.model_validate(
        {"job_id": "sdk-local-1", "repo": str(repo), "planner": {"kind": "python", "entry": ENTRY}}
    )
    client = ToolClient(settings.toolserver_url)
    try:
        agent_run = AgentRun(spec, lease, slot_dir, client)
        yield pool, lease, Workspace(agent_run, token=lease.token, mcp_url=lease.mcp_url)
    finally:
        client.close()


def scripted(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"scripted": list(turns)}}


def test_a_refusal_about_the_call_is_the_models_to_read(
    leased: tuple[SlotPool, Lease, Workspace],
) -> None:
    """A read of a missing file (not_found) is shown to the model, which goes on; the
    write after it applies under its key; reads carry none."""
    workspace = leased[2]
    answer = run(
        workspace,
        scripted(
            {"tool": "read_file", "args": {"path": "missing.txt"}},
            {"tool": "write_file", "args": {"path": "found.txt", "content": "x\n"}},
            {"final": "wrote it"},
        ),
    )
    assert answer == "wrote it"
    assert [(s.tool, s.outcome, s.idempotency_key) for s in workspace.steps] == [
        ("read_file", "refused", None),
        ("write_file", "applied", "sdk-local-1:a1:sdk:call_1"),
    ]
    assert (workspace.steps[0].detail or "").startswith("not_found:")


def test_a_fence_refusal_ends_the_run_with_its_reason(
    leased: tuple[SlotPool, Lease, Workspace],
) -> None:
    """The slot released under the agent: its next call is refused slot_job_mismatch,
    and the run ends there with that reason instead of going on to the next turn."""
    pool, lease, workspace = leased
    pool.release(lease.slot_id, "sdk-local-1", lease.generation)
    with pytest.raises(WorkspaceCallError) as ended:
        run(
            workspace,
            scripted(
                {"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
                {"tool": "run_tests"},
                {"final": "never"},
            ),
        )
    assert ended.value.reason == "slot_job_mismatch" and ended.value.tool == "write_file"
    assert [(s.tool, s.outcome) for s in workspace.steps] == [("write_file", "refused")]


def test_keys_name_the_job_attempt_and_call_and_never_repeat() -> None:
    """call_0 of two runs differs by job and attempt; a call id seen again in one run is
    a new key; a long id is hashed to fit the envelope."""
    keys = CallKeys("job-1", 2)
    assert keys.key("call_0") == "job-1:a2:sdk:call_0"
    assert keys.key("call_0") == "job-1:a2:sdk:call_0~1"
    assert CallKeys("job-1", 3).key("call_0") == "job-1:a3:sdk:call_0"
    long = CallKeys("j" * 128, 1).key("c" * 300)
    assert len(long) <= KEY_MAX_CHARS and long.startswith("j" * 128 + ":a1:sdk:")


def test_the_session_outlasts_run_tests_and_exec_within_the_deadline() -> None:
    """The MCP read timeout: past test_timeout_s and exec's cap, bounded by the deadline."""
    assert session_timeout_s(120, 3600) == 600 + 30  # exec's cap is the longer
    assert session_timeout_s(1800, 3600) == 1800 + 30
    assert session_timeout_s(1800, 100) == 100 + 30


def result(text: str, body: dict[str, Any], is_error: bool) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=body, is_error=is_error
    )


def test_each_mcp_result_becomes_a_step_and_says_whether_the_run_ends() -> None:
    """Applied, replayed, a tool that failed, failing tests, a model's refusal: the run
    goes on; a fence refusal and an unknown outcome end it."""
    counts = Counts()
    applied = result("{}", {"result": {"path": "a"}, "receipt": {"status": "applied"}}, False)
    assert mcp_steps.step(0, "write_file", "k0", applied, counts)[0].outcome == "applied"
    replay = {"result": {}, "receipt": {"status": "applied"}, "replayed": True}
    assert mcp_steps.step(1, "write_file", "k0", result("{}", replay, False), counts)[
        0
    ].outcome == ("replayed")
    failed = result("tool_failed: no", {"result": {"error": "no"}, "receipt": {}}, True)
    assert mcp_steps.step(2, "apply_patch", "k2", failed, counts)[0].detail == "no"
    tests = result("{}", {"result": {"passed": False, "exit_code": 1}, "receipt": {}}, False)
    assert mcp_steps.step(3, "run_tests", "k3", tests, counts)[0].outcome == "failed"
    missing = result("not_found: x", {"error": "not_found", "message": "x"}, True)
    assert mcp_steps.step(4, "read_file", None, missing, counts)[1] is None
    stale = result("stale_generation: held", {"error": "stale_generation"}, True)
    assert mcp_steps.step(5, "write_file", "k5", stale, counts)[1] == "stale_generation"
    unknown = result("outcome_unknown: boom", {"error": "outcome_unknown"}, True)
    step, ends = mcp_steps.step(6, "exec", "k6", unknown, counts)
    assert (step.outcome, ends) == ("unknown", "outcome_unknown")
    assert (counts.receipts, counts.replayed, counts.stale_rejects) == (4, 1, 1)


@pytest.mark.parametrize(
    "model",
    [
        {"scripted": [{"final": "x"}], "name": "m"},
        {"scripted": [{"tool": "exec", "final": "x"}]},
        {"scripted": []},
        {},
    ],
)
def test_a_config_that_names_no_one_model_is_refused(model: dict[str, Any]) -> None:
    """Scripted or named, not both nor neither; each turn a call or an answer."""
    with pytest.raises(ValidationError):
        OpenAIAgentsConfig.model_validate({"model": model})
