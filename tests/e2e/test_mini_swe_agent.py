"""mini-swe-agent's own DefaultAgent in a slot, on the real stack: a Celery worker, the
tool server, Redis, git and bwrap, driven by mini-swe-agent's deterministic model
through examples/mini_swe_agent/job.json. It edits with bash, runs the tests and
submits; a worker SIGKILLed under it resumes as a new attempt that is fenced from the
old one; a cancel releases the slot only once its last command has ended."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from ops.cli import ops
from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import serve
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.jobs.submit import submit
from tests.support.agents import agent_pythonpath
from tests.support.gateway import Gateway, desk_stats, new_run, upstream
from tests.support.mcpclient import mcp_session, text_of
from tests.support.receipts import slot_receipts
from tests.support.repos import REPO, make_repo
from tests.support.stack import FAST, UNACKED_RESTORE_S, Stack, run_cli, stack, wait_until

EXAMPLE = REPO / "examples" / "mini_swe_agent"
# LitellmTextbasedModel's action regex: how mini-swe-agent reads a reply's command.
ACTION = re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.DOTALL)
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SLOW = "sleep 3"
# Waits until the test opens it (at most a minute), then removes it: no trace in the tree.
GATED = "for i in $(seq 1200); do [ -e .gate ] && break; sleep 0.05; done; rm -f .gate"


def sample(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "sample"
    files = {p.name: p.read_text() for p in sorted((EXAMPLE / "sample").iterdir())}
    return repo, make_repo(repo, files)


def example_spec(repo: Path, base: str, job_id: str, *, wait: str | None = None) -> dict[str, Any]:
    """The example's job as shipped, on this test's sample repository; ``wait`` puts
    that command second, for a kill or a cancel to land in."""
    spec: dict[str, Any] = json.loads((EXAMPLE / "job.json").read_text())
    spec |= {"job_id": job_id, "repo": str(repo), "base": base}
    if wait is not None:
        reply = f"THOUGHT: wait for the build.\n\n```mswea_bash_command\n{wait}\n```"
        spec["planner"]["config"]["model"]["outputs"].insert(1, reply)
    return spec


def commands(spec: dict[str, Any]) -> list[str]:
    outputs = spec["planner"]["config"]["model"]["outputs"]
    return [ACTION.findall(text)[0].strip() for text in outputs]


def tree_by_hand(repo: Path, base: str, tmp_path: Path, spec: dict[str, Any]) -> str:
    """The model's commands run with plain bash in a clean checkout of the base, and the
    tree id git gives the result."""
    clone = tmp_path / "by-hand"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", base], cwd=clone, check=True)
    for command in commands(spec):
        subprocess.run(["bash", "-c", command], cwd=clone, check=True, capture_output=True)
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "hand.index")}
    subprocess.run(["git", "add", "-A"], cwd=clone, env=env, check=True)
    return subprocess.run(
        ["git", "write-tree"], cwd=clone, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def receipts(s: Stack, slot_id: str) -> list[dict[str, Any]]:
    return slot_receipts(s.settings.slots_dir / slot_id)


def wait_for_intent(s: Stack, slot_id: str, key: str) -> None:
    """Until the slot's receipts hold the intent of ``key``: the command is running."""
    wait_until(f"the intent of {key}", lambda: any(r["key"] == key for r in receipts(s, slot_id)))


def clean_log(s: Stack) -> None:
    for verb in ("verify", "detect"):
        checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
        assert checked.exit_code == 0, (verb, checked.output)


def test_default_agent_edits_runs_the_tests_and_submits(settings: Settings, tmp_path: Path) -> None:
    """The job succeeds; final_tree is the tree of the same commands run by hand; each
    command is an exec step with its receipt and its log line; the worker's home is
    left as it was."""
    home = tmp_path / "worker-home"
    home.mkdir()
    with stack(settings, tmp_path, HOME=str(home)) as s:
        s.worker("w1")
        repo, base = sample(tmp_path)
        spec = example_spec(repo, base, "mini-e2e-1")
        submit(s.app, s.redis, spec)
        result = s.result("mini-e2e-1", timeout_s=120)
        assert result.state == "succeeded", (result.reason, s.tails())
        assert result.final_tree == tree_by_hand(repo, base, tmp_path, spec)
        steps = result.steps
        assert [(step.tool, step.outcome) for step in steps] == [("exec", "applied")] * 5
        tests_run, submitted = (step.result or {} for step in steps[3:])
        assert tests_run["exit_code"] == 0 and "Ran 3 tests" in tests_run["output"]
        assert submitted["output"].startswith("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n")
        # What the adapter returned (mini-swe-agent's exit status and submission) is
        # the result's ``agent``.
        assert result.agent is not None and result.agent["kind"] == "python"
        returned = result.agent["returned"]
        assert returned["exit_status"] == "Submitted"
        assert returned["submission"] == submitted["output"].split("\n", 1)[1]
        assert "+    return len(text.split())" in submitted["output"]
        assert "+++ b/test_edges.py" in submitted["output"]
        assert result.slot_id is not None
        on_record = receipts(s, result.slot_id)
        for step in steps:
            key = step.idempotency_key
            assert [r["status"] for r in on_record if r["key"] == key] == ["intent", "applied"]
            logged = s.events("tool_result", job_id="mini-e2e-1", idempotency_key=key)
            assert [e["outcome"] for e in logged] == ["applied"]
        assert list(home.iterdir()) == []
        clean_log(s)


def test_an_openai_compatible_model_reaches_its_upstream_through_the_gateway(
    settings: Settings, redis_client: Any, tmp_path: Path
) -> None:
    """litellm's tool-call model at the job's gateway, upstream the fake endpoint
    scripted to call mini-swe-agent's bash tool: the edit, the tests, the submission;
    the job succeeds and every completion held a lease of the run's desk."""
    fix = "sed -i 's/text.split(\" \")/text.split()/' wordcount.py"
    script = tuple(
        ScriptStep(tool="bash", args={"command": command})
        for command in (fix, "python3 -m unittest -q", f"echo {SUBMIT} && git diff")
    )
    endpoint, port = serve(FakeEndpointConfig(seed=5, script=script))
    gateway = Gateway.in_process(settings, redis_client)
    run = new_run()
    try:
        with stack(settings, tmp_path, SLOTRUNNER_GATEWAY_URL=gateway.url) as s:
            s.worker("w1")
            repo, base = sample(tmp_path)
            spec = example_spec(repo, base, "mini-gateway-1")
            planner = spec["planner"]
            planner["config"] |= {
                "base_config": "mini",
                "model": {"model_class": "litellm", "model_name": "fake-model"},
            }
            planner["model"] = {"base_url": upstream(port), "admission_bound": 2}
            spec["eval_run"] = run
            submit(s.app, s.redis, spec)
            result = s.result("mini-gateway-1", timeout_s=120)
            assert result.state == "succeeded", (result.reason, s.tails())
            assert [(step.tool, step.outcome) for step in result.steps] == [("exec", "applied")] * 3
            assert "+    return len(text.split())" in result.diff
            clean_log(s)
        served = endpoint.endpoint.stats()
        desk = desk_stats(redis_client, run, 2)
        seen = gateway.stats()
    finally:
        gateway.stop()
        endpoint.close()
    assert served["completed"] == 3
    assert seen["gateway"]["outcomes"]["completed"] == 3, seen
    assert desk["committed"] == 3 and desk["in_flight"] == 0


def test_a_worker_killed_under_the_agent_resumes_it_as_a_fenced_new_attempt(
    settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL of the whole worker group during the agent's sleep: attempt 2 elsewhere
    runs the agent again from a fresh tree and succeeds; attempt 1's envelope and its
    lease token are refused; every key applied once; the detector finds nothing."""
    job = "mini-killed-1"
    leases = tmp_path / "leases"
    leases.mkdir()
    env = {"PYTHONPATH": agent_pythonpath(), **FAST}
    with stack(settings.with_(slots=1), tmp_path, UNACKED_RESTORE_S, **env) as s:
        s.worker("w1")
        s.worker("w2")
        repo, base = sample(tmp_path)
        spec = example_spec(repo, base, job, wait=SLOW)
        # The same adapter, through an entry that also keeps each attempt's token.
        spec["planner"]["entry"] = "tests.support.agents:mini_recording_lease"
        spec["planner"]["config"]["record_lease_to"] = str(leases)
        submit(s.app, s.redis, spec)
        owner = s.owner_of(job, 1)
        first = s.wait_event("the first lease", "slot_leased", job_id=job, attempt=1)
        slot = str(first["slot_id"])
        wait_for_intent(s, slot, f"{job}:a1:s1:exec")
        owner.signal_group(signal.SIGKILL)
        result = s.result(job, timeout_s=120)
        assert result.state == "succeeded" and result.attempt == 2, (result.reason, s.tails())
        assert result.final_tree == tree_by_hand(repo, base, tmp_path, spec)
        assert [step.idempotency_key for step in result.steps] == [
            f"{job}:a2:s{index}:exec" for index in range(6)
        ]
        second = s.events("slot_leased", job_id=job, attempt=2)
        assert len(second) == 1 and second[0]["generation"] > first["generation"]
        # What the dead attempt's handle would send next is refused by the tool server.
        reply = httpx.post(
            f"{s.server.url}/v1/tools/exec",
            json={
                "envelope": {
                    "job_id": job,
                    "attempt": 1,
                    "slot_id": slot,
                    "generation": first["generation"],
                    "tool": "exec",
                    "idempotency_key": f"{job}:a1:s2:exec",
                },
                "args": {"command": "echo zombie > zombie.txt"},
            },
            timeout=30,
        )
        assert reply.status_code == 409, reply.text
        assert reply.json()["error"] in ("stale_generation", "slot_job_mismatch")
        assert not (s.work(slot) / "zombie.txt").exists()
        # And so is what its agent would send over MCP with the dead attempt's token.
        dead = json.loads((leases / "a1.json").read_text())
        assert (
            dead["token"] and dead["token"] != json.loads((leases / "a2.json").read_text())["token"]
        )
        with mcp_session(dead["mcp_url"], dead["token"]) as mcp:
            refused = mcp.call("exec", {"command": "echo zombie > zombie.txt"}, key=f"{job}:z")
        assert refused.is_error, refused
        assert text_of(refused).startswith(("stale_generation", "slot_job_mismatch")), refused
        assert not (s.work(slot) / "zombie.txt").exists()
        committed = [e for e in s.events("job_finished", job_id=job) if e["committed"]]
        assert [e["attempt"] for e in committed] == [2]
        applied = s.applied_keys(job)
        assert max(applied.values()) == 1 and f"{job}:a1:s1:exec" in applied
        clean_log(s)


def test_a_cancelled_agent_releases_its_slot_after_its_last_command(
    settings: Settings, tmp_path: Path
) -> None:
    """`slotrunner cancel` while the agent's command runs: that command ends, then the
    slot is released, and no command of the agent runs after it; the job ends cancelled."""
    job = "mini-cancel-1"
    with stack(settings, tmp_path) as s:
        s.worker("w1")
        repo, base = sample(tmp_path)
        submit(s.app, s.redis, example_spec(repo, base, job, wait=GATED))
        leased = s.wait_event("the agent's lease", "slot_leased", job_id=job)
        slot = str(leased["slot_id"])
        wait_for_intent(s, slot, f"{job}:a1:s1:exec")
        cancelled = run_cli(s.settings, "cancel", job)
        assert cancelled.returncode == 0, cancelled.stderr
        (s.work(slot) / ".gate").write_text("")
        result = s.result(job)
        assert result.state == "cancelled", result
        assert [step.outcome for step in result.steps] == ["applied", "applied"]
        assert result.diff == ""
        log = s.events()
        at = {id(e): i for i, e in enumerate(log)}
        released = [e for e in log if e["event"] == "slot_released" and e["job_id"] == job]
        assert len(released) == 1
        calls = [e for e in log if e["event"] == "tool_result" and e.get("job_id") == job]
        assert [e["idempotency_key"] for e in calls] == [f"{job}:a1:s0:exec", f"{job}:a1:s1:exec"]
        # The gated command was running at the cancel; the release waited for it to end.
        requested = next(
            e for e in log if e["event"] == "job_cancel_requested" and e.get("job_id") == job
        )
        assert at[id(requested)] < at[id(calls[-1])] < at[id(released[0])]
        assert [r["key"] for r in receipts(s, slot) if r["status"] == "intent"] == [
            f"{job}:a1:s0:exec",
            f"{job}:a1:s1:exec",
        ]
        stamp = read_stamp(s.settings.slots_dir / slot)
        assert stamp is not None and stamp.state == SlotState.IDLE
        clean_log(s)
