"""The OpenAI Agents SDK adapter on the real stack (runner.agent.adapters.openai_agents):
the SDK's own Agent and Runner reach the slot through the tool server's /mcp with the
lease token, driven by its ScriptedModel or by the fake endpoint through the gateway."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ops.cli import ops
from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import serve
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.jobs.submit import submit
from tests.support.gateway import Gateway, desk_stats, new_run, upstream
from tests.support.receipts import slot_receipts
from tests.support.repos import REPO, make_repo
from tests.support.stack import Stack, run_cli, stack, wait_until

EXAMPLE = REPO / "examples" / "openai_agents"
# An exec the test holds open: it writes ``started`` and waits for ``go``.
GATED = "touch started; for i in $(seq 600); do [ -e go ] && exit 0; sleep 0.05; done; exit 3"


def example(s: Stack, name: str, **changes: Any) -> dict[str, Any]:
    """A job spec of examples/openai_agents, its repo a fresh copy of sample/."""
    spec: dict[str, Any] = json.loads((EXAMPLE / name).read_text())
    spec.update(changes)
    repo = s.tmp_path / f"repo-{spec['job_id']}"
    files = {p.name: p.read_text() for p in sorted((EXAMPLE / "sample").iterdir())}
    spec["repo"], spec["base"] = str(repo), make_repo(repo, files)
    return spec


def receipts_by_key(s: Stack, slot_id: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for receipt in slot_receipts(s.settings.slots_dir / slot_id):
        found.setdefault(receipt["key"], []).append(receipt["status"])
    return found


def clean_and_idle(s: Stack) -> None:
    for verb in ("verify", "detect"):
        checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
        assert checked.exit_code == 0, (verb, checked.output)
    for slot in s.settings.slots_dir.iterdir():
        stamp = read_stamp(slot)
        assert stamp is None or stamp.state == SlotState.IDLE, stamp


def patched_and_tested(s: Stack, job_id: str, keys: list[str]) -> None:
    """The job succeeded; its two calls applied once each under ``keys``, each with a
    receipt (intent, applied) and one log line; the log is clean."""
    result = s.result(job_id, timeout_s=90)
    assert result.state == "succeeded", (result.reason, s.tails())
    assert [(st.tool, st.outcome) for st in result.steps] == [
        ("apply_patch", "applied"),
        ("run_tests", "applied"),
    ]
    assert [st.idempotency_key for st in result.steps] == keys
    assert (result.steps[1].result or {})["passed"] is True
    assert '+    return f"Hello, {name}!"' in result.diff
    assert result.counts.tool_calls == 2 and result.counts.receipts == 2
    # The keys the SDK put in _meta are the ones the server bound its receipts to.
    assert receipts_by_key(s, str(result.slot_id)) == {k: ["intent", "applied"] for k in keys}
    assert s.applied_keys(job_id) == Counter(keys)
    assert len(s.events("tool_result", job_id=job_id)) == 2
    assert len(s.events("slot_released", job_id=job_id)) == 1
    clean_and_idle(s)


def test_the_scripted_sdk_agent_patches_and_tests_through_mcp(
    settings: Settings, tmp_path: Path
) -> None:
    """examples/openai_agents/job.json (ScriptedModel): apply_patch then run_tests over
    MCP; the job succeeds, the keys in _meta (job, attempt, call id) reached the receipts."""
    with stack(settings, tmp_path) as s:
        s.worker("w1")
        spec = example(s, "job.json")
        job_id = spec["job_id"]
        submit(s.app, s.redis, spec)
        patched_and_tested(s, job_id, [f"{job_id}:a1:sdk:call_0", f"{job_id}:a1:sdk:call_1"])


def test_the_sdk_agent_on_the_fake_endpoint_through_the_gateway(
    settings: Settings, redis_client: Any, tmp_path: Path
) -> None:
    """OpenAIChatCompletionsModel at the job's gateway, upstream the fake endpoint
    scripted to call apply_patch then run_tests: the job succeeds, and every request
    was admitted under the run's desk."""
    script = tuple(
        ScriptStep.model_validate(step)
        for step in json.loads((EXAMPLE / "script.json").read_text())
    )
    endpoint, port = serve(FakeEndpointConfig(seed=3, script=script))
    gateway = Gateway.in_process(settings, redis_client)
    run = new_run()
    try:
        with stack(settings, tmp_path, SLOTRUNNER_GATEWAY_URL=gateway.url) as s:
            s.worker("w1")
            spec = example(s, "gateway_job.json", eval_run=run)
            spec["planner"]["model"]["base_url"] = upstream(port)
            spec["planner"]["config"]["model"]["max_retries"] = 0
            job_id = spec["job_id"]
            submit(s.app, s.redis, spec)
            result = s.result(job_id, timeout_s=90)
            keys = [str(st.idempotency_key) for st in result.steps]
            # The fake endpoint's call ids: call_<step>_<hash of the conversation>.
            assert [k.rpartition(":")[2][:7] for k in keys] == ["call_0_", "call_1_"], keys
            assert all(k.startswith(f"{job_id}:a1:sdk:") for k in keys), keys
            patched_and_tested(s, job_id, keys)
        served = endpoint.endpoint.stats()
        desk = desk_stats(redis_client, run, spec["planner"]["model"]["admission_bound"])
        seen = gateway.stats()
    finally:
        gateway.stop()
        endpoint.close()
    # Three completions (patch, tests, answer), each under a lease of the run's desk.
    assert served["completed"] == 3
    assert seen["gateway"]["outcomes"]["completed"] == 3, seen
    assert seen["desks"][run]["committed"] == 3 and desk["committed"] == 3
    assert desk["in_flight"] == 0


def test_a_cancelled_sdk_agent_is_stopped_before_its_slot_is_released(
    settings: Settings, tmp_path: Path
) -> None:
    """`slotrunner cancel` during the agent's exec: the exec finishes, the handle closes,
    the run is cancelled; the scripted write after it never reaches the slot, and every
    tool call of the job is logged before the release."""
    config = {
        "model": {
            "scripted": [
                {"tool": "exec", "args": {"command": GATED, "timeout_s": 60.0}},
                {"tool": "write_file", "args": {"path": "late.txt", "content": "too late\n"}},
                {"final": "never reached"},
            ]
        }
    }
    with stack(settings, tmp_path) as s:
        s.worker("w1")
        spec = example(s, "job.json", job_id="sdk-cancel-1")
        spec["planner"]["config"] = config
        submit(s.app, s.redis, spec)
        leased = s.wait_event("the agent's lease", "slot_leased", job_id="sdk-cancel-1")
        work = s.work(str(leased["slot_id"]))
        wait_until("the agent's exec to start", lambda: (work / "started").exists())
        cancelled = run_cli(s.settings, "cancel", "sdk-cancel-1")
        assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout
        (work / "go").write_text("")
        result = s.result("sdk-cancel-1", timeout_s=90)
        assert result.state == "cancelled", result.reason
        assert [(st.tool, st.outcome) for st in result.steps] == [("exec", "applied")]
        assert not (work / "late.txt").exists() and "late.txt" not in result.diff
        order = [
            (e["event"], e.get("tool"))
            for e in s.events(job_id="sdk-cancel-1")
            if e["event"] in ("tool_result", "slot_released")
        ]
        assert order == [("tool_result", "exec"), ("slot_released", None)]
        clean_and_idle(s)
