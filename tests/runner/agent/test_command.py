"""runner.agent.command and runner.agent.process_tree with real processes, /proc and the
host's pids cgroup: exit statuses, the output's tail, the deadline, a stop, leftovers
that left the session (found by the cgroup, or by the marker alone), an older
attempt's orphan, the environment and the program checks."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner.agent.command import (
    AgentAccess,
    CommandError,
    CommandOutcome,
    agent_env,
    end_older_agents,
    find_program,
    run_command,
)
from runner.agent.process_tree import MARKER_ENV, AgentProcess, tree_pids
from runner.core.poll import poll_until
from runner.jobs.models import CommandPlanner, JobSpec

ACCESS = AgentAccess("job-cmd", 1, mcp_url="http://127.0.0.1:1/mcp", token="slr.s0.1.secret")
# A grandchild that leaves the session (setsid) and keeps running: it writes its pid,
# then, unless killed first, a file that must never appear.
LEAVER = """
setsid sh -c 'echo $$ >"$0/leaver.pid"; sleep 2; echo late >"$0/late.txt"; exec sleep 600' \
    "$OUT" &
while [ ! -s "$OUT/leaver.pid" ]; do sleep 0.01; done
"""


def planner(*argv: str, **env: str) -> CommandPlanner:
    spec = JobSpec.model_validate(
        {"repo": "/x", "planner": {"kind": "command", "argv": list(argv), "env": env}}
    )
    assert isinstance(spec.planner, CommandPlanner)
    return spec.planner


def alive(pid: int) -> bool:
    """Running, as /proc says: neither gone nor a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


class Run:
    """One run_command in this test's home, its log events collected."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(
        self,
        command: CommandPlanner,
        *,
        deadline_s: float = 60.0,
        stop: Any = None,
        use_cgroup: bool = True,
        access: AgentAccess = ACCESS,
    ) -> CommandOutcome:
        end = time.monotonic() + deadline_s
        return run_command(
            command,
            access,
            home=self.home,
            log_path=self.home / "logs" / "slotrunner.jsonl",
            remaining_s=lambda: end - time.monotonic(),
            stop_reason=stop or (lambda: None),
            emit=lambda event, **fields: self.events.append((event, fields)),
            use_cgroup=use_cgroup,
        )


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)


def test_exit_zero_succeeds_with_its_output(run: Run) -> None:
    outcome = run(planner("sh", "-c", "echo to-stdout; echo to-stderr >&2"))
    assert outcome.failure is None and outcome.stopped is None
    assert outcome.summary["exit_code"] == 0 and outcome.summary["ended_by"] == "exited"
    assert outcome.summary["output"] == "to-stdout\nto-stderr\n"
    assert [event for event, _ in run.events] == ["agent_started", "agent_ended"]
    assert not (run.home / "agents" / "job-cmd" / "a1").exists()  # the scratch dir is gone


def test_a_non_zero_exit_fails_with_its_code_and_output_tail(run: Run) -> None:
    outcome = run(planner("sh", "-c", "echo first; echo 'it broke' >&2; exit 3"))
    assert (
        outcome.failure == "the agent command sh exited with code 3; output ends: first | it broke"
    )
    assert outcome.summary["exit_code"] == 3


def test_the_output_kept_is_its_tail(run: Run) -> None:
    outcome = run(planner(sys.executable, "-c", "print('x' * 100000); print('THE END')"))
    assert outcome.summary["truncated"] is True
    assert outcome.summary["output"].endswith("THE END\n")
    assert len(outcome.summary["output"]) == 16 * 1024


def test_killed_by_a_signal_is_reported_as_such(run: Run) -> None:
    outcome = run(planner("sh", "-c", "kill -9 $$"))
    assert outcome.failure == "the agent command sh was killed by signal 9 (SIGKILL)"
    assert outcome.summary["exit_code"] == 137


@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "marker-only"])
def test_a_leftover_that_left_the_session_is_dead_before_it_returns(
    run: Run, use_cgroup: bool
) -> None:
    """The agent exits 0 at once; its setsid grandchild (found by the cgroup, or without
    one by the marker in its environment) is killed before run_command returns, and
    never writes the file it was going to."""
    outcome = run(planner("sh", "-c", LEAVER, OUT=str(run.out)), use_cgroup=use_cgroup)
    assert outcome.failure is None, outcome
    leaver = int((run.out / "leaver.pid").read_text())
    assert not alive(leaver)
    assert outcome.summary["leftovers"] >= 1 and outcome.summary["survivors"] == []
    time.sleep(2.5)  # past the moment it would have written
    assert not (run.out / "late.txt").exists()


def test_the_deadline_ends_an_agent_that_ignores_sigterm(run: Run) -> None:
    script = f"trap '' TERM; echo $$ > {run.out}/agent.pid; echo waiting; exec sleep 600"
    outcome = run(planner("sh", "-c", script), deadline_s=1.0)
    assert outcome.failure == (
        "deadline exceeded: the agent command sh had not exited; output ends: waiting"
    )
    assert outcome.summary["ended_by"] == "deadline"
    # `exec sleep` keeps the trap's ignored SIGTERM: only SIGKILL ended it.
    assert outcome.summary["signalled"] == "SIGKILL" and outcome.summary["exit_code"] == 137
    assert not alive(int((run.out / "agent.pid").read_text()))


def test_a_stop_ends_the_agent_with_sigterm_and_is_no_failure(run: Run) -> None:
    started = run.out / "agent.pid"
    script = f"echo $$ > {started}.tmp; mv {started}.tmp {started}; exec sleep 600"
    outcome = run(
        planner("sh", "-c", script),
        stop=lambda: "superseded" if started.exists() else None,
    )
    assert outcome.failure is None and outcome.stopped == "superseded"
    assert outcome.summary["ended_by"] == "superseded"
    assert outcome.summary["signalled"] == "SIGTERM" and outcome.summary["exit_code"] == 143
    assert not alive(int(started.read_text()))


def test_an_older_attempts_orphan_is_ended_by_the_next_attempt(run: Run, tmp_path: Path) -> None:
    """Attempt 1's worker died: its agent still runs; attempt 2 ends it from the record."""
    agents = run.home / "agents" / "job-cmd"
    (agents / "a1").mkdir(parents=True)
    orphan = AgentProcess(
        ["sh", "-c", "setsid sleep 600 & exec sleep 600"],
        cwd=agents / "a1",
        env={"PATH": os.environ["PATH"]},
        marker="m-older",
    )
    record = {"pid": orphan.pid, "marker": "m-older", "cgroup": None}
    if orphan.cgroup is not None:
        record["cgroup"] = str(orphan.cgroup.path)
    (agents / "a1.json").write_text(json.dumps(record))
    poll_until(lambda: len(tree_pids(orphan.pid, "m-older", None)) == 2, 10, what="its child")
    children = tree_pids(orphan.pid, "m-older", None)
    killed = end_older_agents(run.home, "job-cmd", 2, lambda event, **f: None)
    assert killed == 2 and not any(alive(pid) for pid in children)
    assert not (agents / "a1.json").exists() and not (agents / "a1").exists()
    orphan.end()


def test_the_environment_is_the_contract_and_little_else(tmp_path: Path) -> None:
    worker = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/w",
        "REDIS_URL": "redis://secret",
        "SLOTRUNNER_TOKEN": "server-token",
        "OPENAI_API_KEY": "operator-key",
    }
    plain = agent_env(planner("agent", EXTRA="1"), ACCESS, worker)
    assert plain == {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": "/home/w",
        "EXTRA": "1",
        "SLOTRUNNER_JOB_ID": "job-cmd",
        "SLOTRUNNER_ATTEMPT": "1",
        "SLOTRUNNER_MCP_URL": "http://127.0.0.1:1/mcp",
        "SLOTRUNNER_TOKEN": "slr.s0.1.secret",
    }
    gateway = AgentAccess(
        "job-cmd", 1, None, gateway_url="http://127.0.0.1:2/v1", gateway_key="srgw-k"
    )
    with_model = agent_env(planner("agent"), gateway, worker)
    assert (
        with_model["SLOTRUNNER_GATEWAY_URL"] == with_model["OPENAI_BASE_URL"] == gateway.gateway_url
    )
    assert with_model["SLOTRUNNER_GATEWAY_KEY"] == with_model["OPENAI_API_KEY"] == "srgw-k"
    assert "srgw-k" not in repr(gateway) and "secret" not in repr(ACCESS)


def test_the_agent_runs_in_its_scratch_dir_with_its_marker(run: Run) -> None:
    script = f'pwd > {run.out}/cwd; echo "${MARKER_ENV}" > {run.out}/marker'
    assert run(planner("sh", "-c", script)).failure is None
    assert (run.out / "cwd").read_text().strip() == str(run.home / "agents" / "job-cmd" / "a1")
    assert len((run.out / "marker").read_text().strip()) == 32


def test_a_program_that_cannot_run_is_named(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    with pytest.raises(CommandError, match="'no-such-agent' was not found on the agent's PATH"):
        find_program(planner("no-such-agent"), env)
    with pytest.raises(CommandError, match="no such file"):
        find_program(planner(str(tmp_path / "absent")), env)
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(CommandError, match="is not executable"):
        find_program(planner(str(script)), env)
    script.chmod(0o755)
    assert find_program(planner("agent.sh"), env) == str(script)
