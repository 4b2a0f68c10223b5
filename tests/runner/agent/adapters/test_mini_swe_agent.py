"""The mini-swe-agent adapter against a real tool server, real leases and real git:
its environment's answers in mini-swe-agent's format, its submission, a timeout, a
refused call that stops the agent, and the configs it refuses before any command.
The runner's own Celery path is tests/e2e/test_mini_swe_agent.py."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.agent.adapters.mini_swe_agent import (
    ENVIRONMENT_CLASS,
    MiniSweAgentError,
    SlotEnvironment,
    run,
)
from runner.agent.adapters.mini_swe_agent.agent import gateway_model_config
from runner.agent.api import Workspace, WorkspaceCallError
from runner.agent.loop import AgentRun
from runner.core import events
from runner.core.logs import EventLog
from runner.jobs.models import JobSpec
from runner.slots.pool import Lease, SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.receipts import slot_receipts
from tests.support.repos import REPO, make_repo
from tests.support.toolserver import ToolServer
from tools.builtin import write_job
from tools.client import ToolClient

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
ENTRY = "runner.agent.adapters.mini_swe_agent:run"


def reply(command: str) -> str:
    return f"THOUGHT: next.\n\n```mswea_bash_command\n{command}\n```"


class Host:
    """This test's slots, leased from the real pool, and handles over them."""

    def __init__(self, server: ToolServer, tmp_path: Path) -> None:
        self.settings = server.settings
        client = redis.Redis.from_url(self.settings.redis_url or "", decode_responses=True)
        self.pool = SlotPool(self.settings, client, EventLog(self.settings))
        self.repo = tmp_path / "repo"
        self.base = make_repo(self.repo, {"pkg/__init__.py": "", "README": "sample\n"})
        self.clients: list[ToolClient] = []

    def handle(
        self,
        job_id: str,
        *,
        should_stop: Callable[[], str | None] | None = None,
        **gateway: str,
    ) -> tuple[Lease, Workspace]:
        lease = self.pool.lease(job_id, 1)
        slot_dir = self.settings.slots_dir / lease.slot_id
        Workspaces(self.settings.home).prepare(slot_dir, str(self.repo), self.base, job_id)
        write_job(
            slot_dir,
            {"job_id": job_id, "generation": lease.generation, "test_command": []},
        )
        spec = JobSpec.model_validate(
            {
                "job_id": job_id,
                "repo": str(self.repo),
                "planner": {"kind": "python", "entry": ENTRY},
            }
        )
        client = ToolClient(self.settings.toolserver_url)
        self.clients.append(client)
        agent_run = AgentRun(spec, lease, slot_dir, client, should_stop=should_stop)
        return lease, Workspace(agent_run, token=lease.token, mcp_url=lease.mcp_url, **gateway)

    def work(self, lease: Lease) -> Path:
        return self.settings.slots_dir / lease.slot_id / "work"

    def log(self, job_id: str) -> list[dict[str, Any]]:
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


def mini_config(*commands: str, **sections: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "task": "make the change",
        "base_config": "default",
        "model": {"model_class": "deterministic", "outputs": [reply(c) for c in commands]},
    }
    config.update(sections)
    return config


def test_commands_run_in_the_slot_and_answer_in_mini_swe_agents_format(host: Host) -> None:
    """Output and exit code as LocalEnvironment gives them, cwd and env applied; each
    command one exec step with its key, its receipt and its log line."""
    lease, ws = host.handle("mini-env-1")
    env = SlotEnvironment(ws, cwd="pkg", env={"GREETING": "hi there"}, timeout=20)
    out = env.execute({"command": "echo $GREETING > note.txt; cat note.txt; exit 3"})
    assert out == {"output": "hi there\n", "returncode": 3, "exception_info": ""}
    assert (host.work(lease) / "pkg" / "note.txt").read_text() == "hi there\n"
    assert env.execute({"command": "  "}) == {"output": "", "returncode": 0, "exception_info": ""}
    # The marker with a failing exit code is output, as in LocalEnvironment.
    failed = env.execute({"command": f"echo {SUBMIT}; false"})
    assert failed["returncode"] == 1 and failed["output"] == f"{SUBMIT}\n"
    with pytest.raises(Exception) as submitted:
        env.execute({"command": f"echo {SUBMIT}; cat note.txt"})
    # Imported by the environment, with its variables set (never at this module's top).
    from minisweagent.exceptions import Submitted

    assert isinstance(submitted.value, Submitted)
    assert submitted.value.messages[0]["extra"] == {
        "exit_status": "Submitted",
        "submission": "hi there\n",
    }
    variables = env.get_template_vars()
    assert variables["system"] == platform.system() and variables["machine"]
    assert variables["slot_id"] == lease.slot_id and "PATH" not in variables
    assert env.serialize()["info"]["config"]["environment_type"] == ENVIRONMENT_CLASS
    keys = [step.idempotency_key for step in ws.steps]
    assert [step.tool for step in ws.steps] == ["exec"] * 3 and len(set(keys)) == 3
    applied = {r["key"] for r in host.receipts(lease) if r["status"] == "applied"}
    logged = {e["idempotency_key"] for e in host.log("mini-env-1") if e["outcome"] == "applied"}
    assert set(keys) == applied == logged


def test_a_command_past_its_timeout_answers_as_local_environment_does(host: Host) -> None:
    """returncode -1, the output so far, exception_info naming the timeout; the slot's
    process is gone (exec killed it)."""
    _, ws = host.handle("mini-env-timeout")
    env = SlotEnvironment(ws, timeout=1)
    out = env.execute({"command": "echo partial; sleep 30"})
    assert out["returncode"] == -1 and out["output"] == "partial\n"
    assert out["exception_info"] == (
        "An error occurred while executing the command: "
        "Command 'echo partial; sleep 30' timed out after 1 seconds"
    )
    assert out["extra"]["exception_type"] == "TimeoutExpired"
    assert ws.steps[0].result is not None and ws.steps[0].result["timed_out"] is True


def test_default_agent_submits_through_the_slot(host: Host) -> None:
    """run(): DefaultAgent edits with bash and submits; its submission is the output
    after the marker; nothing of mini-swe-agent's is left in the environment."""
    lease, ws = host.handle("mini-run-1")
    before = {k: v for k, v in os.environ.items() if k.startswith(("MSWEA_", "LITELLM_"))}
    config = mini_config(
        "cat README",
        "sed -i 's/sample/changed/' README && cat <<'EOF' > pkg/new.py\nx = 1\nEOF",
        f"echo {SUBMIT} && cat README",
    )
    assert run(ws, config) == {"exit_status": "Submitted", "submission": "changed\n"}
    assert (host.work(lease) / "pkg" / "new.py").read_text() == "x = 1\n"
    assert [step.outcome for step in ws.steps] == ["applied"] * 3
    after = {k: v for k, v in os.environ.items() if k.startswith(("MSWEA_", "LITELLM_"))}
    assert after == before
    import minisweagent

    assert Path.home() not in Path(minisweagent.global_config_dir).parents


def test_an_agent_that_does_not_submit_fails_with_its_exit_status(host: Host) -> None:
    _, ws = host.handle("mini-run-limit")
    config = mini_config("true", "true", agent={"step_limit": 1})
    with pytest.raises(MiniSweAgentError, match="exit status LimitsExceeded without submitting"):
        run(ws, config)
    assert len(ws.steps) == 1


def test_a_deterministic_model_without_a_submission_says_it_ran_out(host: Host) -> None:
    _, ws = host.handle("mini-run-out")
    with pytest.raises(MiniSweAgentError, match="ran out of outputs after 2 without a submission"):
        run(ws, mini_config("true", "true"))
    assert len(ws.steps) == 2


def test_a_refused_call_stops_the_agent_instead_of_reaching_the_model(host: Host) -> None:
    """The lease released under the agent after its first command: the next one is
    refused by the tool server and raised out of DefaultAgent.run, not observed."""
    asked: list[int] = []

    def release_before_the_second() -> None:
        # The handle asks before each call (under its lock: no handle method here).
        asked.append(1)
        if len(asked) == 2:
            host.pool.release(lease.slot_id, "mini-run-stale", lease.generation)

    lease, ws = host.handle("mini-run-stale", should_stop=lambda: release_before_the_second())
    config = mini_config("echo one > one.txt", "echo two > two.txt", f"echo {SUBMIT}")
    with pytest.raises(WorkspaceCallError) as refused:
        run(ws, config)
    assert refused.value.reason == "slot_job_mismatch"
    assert [step.outcome for step in ws.steps] == ["applied", "refused"]
    assert not (host.work(lease) / "two.txt").exists()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"environment": {"environment_class": "local"}}, "commands run only through"),
        ({"environment": {"image": "python:3.11"}}, "environment: image"),
        ({"environment": {"timeout": 601}}, "environment: timeout"),
        ({"agent": {"output_path": "/tmp/traj.json"}}, "agent.output_path"),
        ({"agent": {"agent_class": "interactive"}}, "a slot runs DefaultAgent"),
        ({"model": {"model_class": "portkey", "model_name": "m"}}, "model.model_class 'portkey'"),
        ({"model": {"model_class": "litellm", "model_name": "m"}}, "no admission gateway"),
        ({"model": {"model_class": "deterministic", "outputs": ["no block"]}}, "outputs[0]"),
        ({"task": ""}, "task"),
        ({"base_config": "no-such-config"}, "base_config 'no-such-config'"),
    ],
)
def test_a_config_that_cannot_run_in_a_slot_is_refused_before_any_command(
    host: Host, change: dict[str, Any], needle: str
) -> None:
    _, ws = host.handle("mini-refused")
    with pytest.raises(MiniSweAgentError) as refused:
        run(ws, mini_config("touch made.txt", f"echo {SUBMIT}") | change)
    assert needle in str(refused.value)
    assert ws.steps == []


def test_an_openai_compatible_model_is_pointed_at_the_jobs_gateway(host: Host) -> None:
    """The gateway's URL and the job's credential replace whatever the config says;
    litellm's openai/ provider names the model."""
    _, ws = host.handle("mini-gw", gateway_url="http://127.0.0.1:9/v1", gateway_key="cred")
    section = {
        "model_name": "upstream-model",
        "model_kwargs": {"api_base": "https://elsewhere.example/v1", "temperature": 0},
    }
    config = gateway_model_config("litellm_textbased", section, ws)
    assert config["model_name"] == "openai/upstream-model"
    assert config["model_kwargs"] == {
        "temperature": 0,
        "api_base": "http://127.0.0.1:9/v1",
        "api_key": "cred",
    }
    assert config["cost_tracking"] == "ignore_errors"


def test_the_runner_and_the_adapter_import_without_mini_swe_agent() -> None:
    """Importing the worker and the adapter's entry loads neither mini-swe-agent nor
    litellm: the runner works without the agents extra."""
    probe = (
        "import sys, runner.worker.tasks, runner.jobs.entry, runner.agent.adapters.mini_swe_agent;"
        "print([m for m in sys.modules if m.split('.')[0] in ('minisweagent', 'litellm')])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
