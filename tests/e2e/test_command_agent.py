"""The ``command`` planner kind, and agents' model traffic through the gateway, on the real
stack: a real Celery worker starts the agent (tests/support/command_agent.py), which
reaches a real tool server over MCP with its lease token; real Redis, git, /proc and
the host's pids cgroup. Each case ends with the slot released once, idle, and the
agent's whole tree gone before that release (docs/architecture.md §Agents)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from click.testing import CliRunner

from ops.cli import ops
from ops.testing.fake_endpoint.plan import FakeEndpointConfig
from ops.testing.fake_endpoint.server import serve
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.jobs.cancel import cancel
from runner.jobs.queue import QUEUE, TASK_NAME
from runner.jobs.submit import SpecError, parse_spec, submit
from tests.support.agents import agent_pythonpath
from tests.support.gateway import Gateway, upstream
from tests.support.stack import FAST, UNACKED_RESTORE_S, Stack, stack, wait_until

AGENT = [sys.executable, "-m", "tests.support.command_agent"]


def command(s: Stack, job_id: str, argv: list[str], **extra: Any) -> dict[str, Any]:
    planner: dict[str, Any] = {"kind": "command", "argv": argv, "env": extra.pop("env", {})}
    if "model" in extra:
        planner["model"] = extra.pop("model")
    return {"job_id": job_id, "repo": str(s.repo), "base": s.base, "planner": planner, **extra}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def published(path: Path) -> Any:
    return read_json(
        wait_until(f"{path.name} to be written", lambda: path if path.exists() else None)
    )


def log_order(s: Stack, job_id: str) -> list[str]:
    return [e["event"] for e in s.events(job_id=job_id)]


def ended_before_release(s: Stack, job_id: str) -> dict[str, Any]:
    """The agent_ended line (its tree gone) comes before the slot's one release."""
    order = log_order(s, job_id)
    assert order.count("slot_released") == 1 and order.count("agent_ended") == 1, order
    assert order.index("agent_ended") < order.index("slot_released"), order
    return s.events("agent_ended", job_id=job_id)[0]


def settled(s: Stack) -> None:
    for slot in s.settings.slots_dir.iterdir():
        stamp = read_stamp(slot)
        assert stamp is None or stamp.state == SlotState.IDLE, stamp
    for verb in ("verify", "detect"):
        checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
        assert checked.exit_code == 0, (verb, checked.output)


@contextmanager
def gateway_and_endpoint(
    settings: Settings, redis_client: redis.Redis
) -> Iterator[tuple[Gateway, Any, Settings]]:
    server, _ = serve(FakeEndpointConfig(echo_text="hello from the model"))
    gateway = Gateway.in_process(settings, redis_client)
    try:
        yield gateway, server, settings.with_(gateway_url=gateway.url)
    finally:
        gateway.stop()
        server.close()


def test_the_agent_gets_its_lease_door_and_the_gateway_and_nothing_of_the_workers(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The environment contract, the working directory outside the slot, a call through
    MCP (its step and receipt in the result), a completion through the gateway with an
    unconfigured OpenAI client; the credential dead once the job ended."""
    out = tmp_path / "out"
    out.mkdir()
    with (
        gateway_and_endpoint(settings, redis_client) as (gateway, endpoint, with_gateway),
        stack(with_gateway, tmp_path, PYTHONPATH=agent_pythonpath()) as s,
    ):
        s.worker("w1")
        model = {"base_url": upstream(endpoint.port), "admission_bound": 2}
        spec = command(s, "cmd-env-1", [*AGENT, "report"], env={"OUT": str(out)}, model=model)
        submit(s.app, s.redis, spec)
        result = s.result("cmd-env-1")
        assert result.state == "succeeded", (result, s.tails())
        found = read_json(out / "report-a1")
        env = found["env"]
        leased = s.events("slot_leased", job_id="cmd-env-1")[0]
        assert env["SLOTRUNNER_JOB_ID"] == "cmd-env-1" and env["SLOTRUNNER_ATTEMPT"] == "1"
        assert env["SLOTRUNNER_MCP_URL"] == f"{s.settings.toolserver_url}/mcp"
        assert env["SLOTRUNNER_TOKEN"].startswith(
            f"slr.{leased['slot_id']}.{leased['generation']}."
        )
        assert env["SLOTRUNNER_GATEWAY_URL"] == env["OPENAI_BASE_URL"] == gateway.url
        assert env["SLOTRUNNER_GATEWAY_KEY"] == env["OPENAI_API_KEY"]
        assert env["OUT"] == str(out)
        # None of the worker's own configuration reaches the agent.
        for name in ("REDIS_URL", "SLOTRUNNER_HOME", "SLOTRUNNER_TOOLSERVER_URL"):
            assert name not in env
        cwd = Path(found["cwd"])
        assert cwd == s.settings.home / "agents" / "cmd-env-1" / "a1"
        assert not cwd.is_relative_to(s.settings.slots_dir) and not cwd.exists()
        assert found["completion"] == "hello from the model"
        assert endpoint.endpoint.stats()["completed"] == 1
        assert gateway.outcomes().get("completed") == 1
        # The call it made through MCP: a step of the result, a receipt, a log line.
        assert found["write_file"]["receipt"]["status"] == "applied"
        assert [(st.tool, st.outcome, st.idempotency_key) for st in result.steps] == [
            ("write_file", "applied", "w-1")
        ]
        assert result.counts.tool_calls == 1 and result.counts.receipts == 1
        assert "agent.txt" in result.diff and "+via mcp" in result.diff
        assert result.agent is not None and result.agent["exit_code"] == 0
        ended_before_release(s, "cmd-env-1")
        # The job is over: its credential is refused.
        late = openai.OpenAI(base_url=gateway.url, api_key=env["OPENAI_API_KEY"], max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            late.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        settled(s)


def test_the_spec_env_cannot_set_the_contract() -> None:
    base = {"repo": "/x", "planner": {"kind": "command", "argv": ["agent"]}}
    for env, model in [
        ({"SLOTRUNNER_TOKEN": "forged"}, None),
        ({"SLOTRUNNER_MCP_URL": "http://elsewhere/mcp"}, None),
        ({"OPENAI_BASE_URL": "http://around-the-gateway/v1"}, {"base_url": "http://u/v1"}),
    ]:
        spec = json.loads(json.dumps(base))
        spec["planner"]["env"] = env
        if model:
            spec["planner"]["model"] = model
        with pytest.raises(SpecError, match=next(iter(env))):
            parse_spec(spec)  # what submit() and `slotrunner submit` check first


def test_failures_fail_the_job_with_a_clear_reason_and_leave_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    """A non-zero exit (its code and output's tail in the reason); a program that cannot
    be found, enqueued with plain Celery (rejected before any slot is leased)."""
    with stack(settings, tmp_path) as s:
        s.worker("w1")
        script = "echo working; echo 'no fix found' >&2; exit 3"
        submit(s.app, s.redis, command(s, "cmd-exit-3", ["sh", "-c", script]))
        missing = command(s, "cmd-missing", ["no-such-agent-program"])
        s.app.send_task(TASK_NAME, args=[missing], queue=QUEUE)
        failed = s.result("cmd-exit-3")
        assert failed.state == "failed"
        assert failed.reason == (
            "the agent command sh exited with code 3; output ends: working | no fix found"
        )
        assert failed.agent is not None and failed.agent["exit_code"] == 3
        assert failed.agent["output"] == "working\nno fix found\n"
        assert failed.final_tree is not None and failed.diff == ""
        ended_before_release(s, "cmd-exit-3")
        rejected = s.result("cmd-missing")
        assert rejected.state == "rejected" and rejected.slot_id is None
        assert "'no-such-agent-program' was not found on the agent's PATH" in (
            rejected.reason or ""
        )
        assert s.events("slot_leased", job_id="cmd-missing") == []
        assert s.events("agent_started", job_id="cmd-missing") == []
        settled(s)


def test_an_agent_that_never_exits_and_ignores_sigterm_ends_at_the_deadline(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {"PYTHONPATH": agent_pythonpath(), "SLOTRUNNER_MIN_DEADLINE_S": "0"}
    with stack(settings, tmp_path, **env) as s:
        s.worker("w1")
        argv = [*AGENT, "hold", "--ignore-term"]
        submit(s.app, s.redis, command(s, "cmd-late-1", argv, env={"OUT": str(out)}, deadline_s=8))
        pid = published(out / "pid-a1")
        result = s.result("cmd-late-1")
        assert result.state == "failed", result
        assert result.reason == (
            "deadline exceeded: the agent command "
            f"{sys.executable} had not exited; output ends: holding"
        )
        assert result.agent is not None and result.agent["signalled"] == "SIGKILL"
        assert not alive(pid)
        assert ended_before_release(s, "cmd-late-1")["ended_by"] == "deadline"
        settled(s)


def test_a_leftover_child_is_dead_before_the_release_and_never_reaches_the_next_job(
    settings: Settings, tmp_path: Path
) -> None:
    """The agent exits 0 leaving a grandchild in a session of its own that would write
    into the slot's tree five seconds later: killed before the release (/proc), and
    the next job in that slot, running past the five seconds, never sees its file."""
    out = tmp_path / "out"
    out.mkdir()
    with stack(settings.with_(slots=1), tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        s.worker("w1")
        env = {"OUT": str(out), "SLOTS": str(s.settings.slots_dir)}
        submit(s.app, s.redis, command(s, "cmd-leaver-1", [*AGENT, "leaver"], env=env))
        first = s.result("cmd-leaver-1")
        assert first.state == "succeeded", first
        leaver = int((out / "leaver.pid").read_text())
        assert not alive(leaver)
        assert first.agent is not None and first.agent["leftovers"] >= 1
        assert ended_before_release(s, "cmd-leaver-1")["survivors"] == []
        submit(s.app, s.redis, command(s, "cmd-after-1", ["sh", "-c", "sleep 6"]))
        second = s.result("cmd-after-1")
        assert second.state == "succeeded" and second.slot_id == first.slot_id, second
        assert second.diff == "" and "late.txt" not in second.diff
        assert not (s.work(str(second.slot_id)) / "late.txt").exists()
        settled(s)


def test_cancel_mid_run_releases_the_slot_only_after_the_agent_is_gone(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        s.worker("w1")
        submit(s.app, s.redis, command(s, "cmd-cancel-1", [*AGENT, "hold"], env={"OUT": str(out)}))
        pid = published(out / "pid-a1")
        cancel(s.redis, "cmd-cancel-1")
        result = s.result("cmd-cancel-1")
        assert result.state == "cancelled", result
        assert not alive(pid)
        ended = ended_before_release(s, "cmd-cancel-1")
        assert ended["ended_by"] == "cancelled"
        assert result.agent is not None and result.agent["signalled"] == "SIGTERM"
        assert len(s.events("slot_cancel_requested", job_id="cmd-cancel-1")) == 1
        settled(s)


def test_a_new_attempt_ends_the_old_attempts_agent(settings: Settings, tmp_path: Path) -> None:
    """The first attempt's worker is paused past its heartbeat: the second attempt, on
    this host, ends the first one's agent before it leases; the paused worker, resumed,
    learns it was superseded and commits nothing."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"PYTHONPATH": agent_pythonpath(), **FAST}
    with stack(settings.with_(slots=1), tmp_path, UNACKED_RESTORE_S, **env) as s:
        s.worker("w1")
        s.worker("w2")
        spec = command(s, "cmd-super-1", [*AGENT, "hold"], env={"OUT": str(out)})
        submit(s.app, s.redis, spec)
        zombie = s.owner_of("cmd-super-1", 1)
        old_pid = published(out / "pid-a1")
        zombie.signal_group(signal.SIGSTOP)
        try:
            new_pid = published(out / "pid-a2")
            assert not alive(old_pid)
        finally:
            zombie.signal_group(signal.SIGCONT)
        result = s.result("cmd-super-1")
        assert result.state == "succeeded" and result.attempt == 2, result
        assert not alive(new_pid)
        ended = s.events("agent_leftovers_ended", job_id="cmd-super-1", attempt=2)
        assert len(ended) == 1 and ended[0]["older_attempt"] == 1 and ended[0]["killed"] >= 1
        order = [(e["event"], e.get("attempt")) for e in s.events(job_id="cmd-super-1")]
        assert order.index(("agent_leftovers_ended", 2)) < order.index(("agent_started", 2))
        s.wait_event("the paused attempt to learn", "job_superseded", job_id="cmd-super-1")
        s.wait_event("its agent's end", "agent_ended", job_id="cmd-super-1", attempt=1)


def test_a_python_agent_with_a_model_block_reaches_the_model_through_the_gateway(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    key_file = tmp_path / "gateway.key"
    with (
        gateway_and_endpoint(settings, redis_client) as (gateway, endpoint, with_gateway),
        stack(with_gateway, tmp_path, PYTHONPATH=agent_pythonpath()) as s,
    ):
        s.worker("w1")
        spec = {
            "job_id": "py-model-1",
            "eval_run": "run-py-model",
            "repo": str(s.repo),
            "base": s.base,
            "planner": {
                "kind": "python",
                "entry": "tests.support.agents:chat_through_gateway",
                "config": {"key_file": str(key_file)},
                "model": {"base_url": upstream(endpoint.port), "admission_bound": 1},
            },
        }
        submit(s.app, s.redis, spec)
        result = s.result("py-model-1")
        assert result.state == "succeeded", result
        assert "+hello from the model" in result.diff
        assert endpoint.endpoint.stats()["completed"] == 1
        assert gateway.outcomes().get("completed") == 1
        assert "run-py-model" in gateway.stats()["desks"]  # its requests held that run's leases
        late = openai.OpenAI(base_url=gateway.url, api_key=key_file.read_text(), max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            late.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        settled(s)
