"""The ``command`` planner's loop: an external agent process, run until it exits.

``{"kind": "command", "argv": [...], "env": {...}, "model": {...}?}``
(docs/architecture.md §Agents). The agent, in any language, reaches its slot's tools
through the tool server's MCP door with the lease's token; the runner starts it, watches
it, ends it and reports, and keeps the lease, the snapshots, the release and the result.

- **Environment** (:func:`agent_env`). Only a few of the worker's variables
  (:data:`INHERITED`: no Redis URL, no server token, no API key of the operator's), with
  ``PATH`` led by the directory of the worker's Python (its virtualenv's ``bin``), so
  ``python3`` in ``argv`` is the interpreter the worker runs with. Then the spec's
  ``env``, then the runner's: ``SLOTRUNNER_MCP_URL``, ``SLOTRUNNER_TOKEN``,
  ``SLOTRUNNER_JOB_ID``, ``SLOTRUNNER_ATTEMPT`` and, with a ``model`` block,
  ``SLOTRUNNER_GATEWAY_URL`` and ``SLOTRUNNER_GATEWAY_KEY``, also as
  ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` so that an OpenAI client finds the
  gateway with no configuration. The spec cannot set those (``runner.jobs.models``).
- **Program** (:func:`find_program`). ``argv[0]`` is a name looked up on that ``PATH``
  or an absolute path; one that cannot be found or is not executable is refused before
  any slot is leased.
- **Working directory**: a fresh scratch directory per attempt,
  ``$SLOTRUNNER_HOME/agents/<job_id>/a<attempt>/``, outside every slot; removed once
  the agent is gone. The agent is not sandboxed: it runs as the worker's user; what
  the fence guards is every tool call it makes.
- **Watching** (:func:`run_command`). Every :data:`WATCH_S`: a stop (superseded,
  cancelled, lease lost), the agent's exit, the job's deadline. A stop or the deadline
  sends SIGTERM to its process group and, after :data:`TERM_GRACE_S`, SIGKILL.
  Whatever way it ends, its whole tree is then killed and confirmed gone
  (``runner.agent.process_tree``) before this returns, so before the slot is released.
- **Result**: exit 0 succeeds the job, any other status fails it with the status and
  the output's tail in the reason, the deadline fails it; :attr:`CommandOutcome.summary`
  goes into the job result as ``agent``, and the calls the agent made, read back from
  the host log (``runner.agent.tool_log``), are its ``steps``.
- **A dead worker's agent**: a record beside the scratch directory names the run's
  marker and cgroup; the job's next attempt on this host ends what is left of it
  (:func:`end_older_agents`) before it leases a slot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.agent.process_tree import AgentProcess, end_marked, new_marker
from runner.agent.tool_log import CallLog
from runner.errors import RunnerError
from runner.jobs import events as job_events
from runner.jobs.models import CommandPlanner, Counts, StepRecord

MCP_URL_ENV = "SLOTRUNNER_MCP_URL"
TOKEN_ENV = "SLOTRUNNER_TOKEN"
GATEWAY_URL_ENV = "SLOTRUNNER_GATEWAY_URL"
GATEWAY_KEY_ENV = "SLOTRUNNER_GATEWAY_KEY"
JOB_ID_ENV = "SLOTRUNNER_JOB_ID"
ATTEMPT_ENV = "SLOTRUNNER_ATTEMPT"
# The worker's own variables an agent keeps; nothing else of its environment passes.
INHERITED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE",
    "TZ", "TMPDIR", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip
_FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"
WATCH_S = 0.2
# How the agent ended (``ended_by``), beside the stop reasons (superseded, cancelled,
# lease_lost: runner.worker.attempt).
EXITED = "exited"
DEADLINE = "deadline"
TERM_GRACE_S = 5.0
# How much of the output's tail a failed job's reason quotes (the result keeps more).
REASON_TAIL_CHARS = 600

Emit = Callable[..., None]


class CommandError(RunnerError, ValueError):
    """A command planner's program that cannot be found or started (the job's reason)."""


@dataclass(frozen=True)
class AgentAccess:
    """What the runner hands the agent: who it is, its slot's door, the gateway."""

    job_id: str
    attempt: int
    mcp_url: str | None
    token: str | None = field(default=None, repr=False)
    gateway_url: str | None = None
    gateway_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CommandOutcome:
    """How the agent ended: ``failure`` the job's reason when it failed, ``stopped`` the
    stop the watch saw, ``summary`` the result's ``agent``, and its calls."""

    failure: str | None = None
    stopped: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)


def agent_env(
    planner: CommandPlanner, access: AgentAccess, worker_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The agent's whole environment (module docstring)."""
    worker_env = os.environ if worker_env is None else worker_env
    env = {name: worker_env[name] for name in INHERITED if name in worker_env}
    python_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([python_bin, worker_env.get("PATH") or _FALLBACK_PATH])
    env.update(planner.env)
    env[JOB_ID_ENV] = access.job_id
    env[ATTEMPT_ENV] = str(access.attempt)
    if access.mcp_url:
        env[MCP_URL_ENV] = access.mcp_url
    if access.token:
        env[TOKEN_ENV] = access.token
    if access.gateway_url and access.gateway_key:
        env[GATEWAY_URL_ENV] = env["OPENAI_BASE_URL"] = access.gateway_url
        env[GATEWAY_KEY_ENV] = env["OPENAI_API_KEY"] = access.gateway_key
    return env


def find_program(planner: CommandPlanner, env: Mapping[str, str]) -> str:
    """The path ``argv[0]`` runs; CommandError naming the problem when there is none."""
    program = planner.argv[0]
    if "/" in program:
        found: str | None = program
        if not os.path.isfile(program):
            raise CommandError(f"planner.argv[0] {program!r}: no such file")
    else:
        found = shutil.which(program, path=env.get("PATH", ""))
        if found is None:
            raise CommandError(
                f"planner.argv[0] {program!r} was not found on the agent's PATH "
                f"({env.get('PATH', '')})"
            )
    assert found is not None
    if not os.access(found, os.X_OK):
        raise CommandError(f"planner.argv[0] {program!r}: {found} is not executable")
    return found


def agents_dir(home: Path, job_id: str) -> Path:
    return home / "agents" / job_id


def run_command(
    planner: CommandPlanner,
    access: AgentAccess,
    *,
    home: Path,
    log_path: Path,
    remaining_s: Callable[[], float],
    stop_reason: Callable[[], str | None],
    emit: Emit,
    use_cgroup: bool = True,
) -> CommandOutcome:
    """Start the agent, watch it until it exits, the job must stop or the deadline
    passes, then end its whole tree; returns once every process of it is gone."""
    program = planner.argv[0]
    env = agent_env(planner, access)
    try:
        find_program(planner, env)
    except CommandError as exc:
        return CommandOutcome(failure=str(exc))
    base = agents_dir(home, access.job_id)
    scratch, record = base / f"a{access.attempt}", base / f"a{access.attempt}.json"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    calls = CallLog(log_path)
    marker = new_marker()
    try:
        proc = AgentProcess(
            planner.argv, cwd=scratch, env=env, marker=marker, use_cgroup=use_cgroup
        )
    except OSError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        return CommandOutcome(failure=f"the agent command {program!r} could not be started: {exc}")
    cgroup = str(proc.cgroup.path) if proc.cgroup is not None else None
    # Plain, not durable: it is for a worker that dies, and a host that crashes takes
    # the agent with it.
    record.write_text(json.dumps({"pid": proc.pid, "marker": marker, "cgroup": cgroup}))
    who = {"job_id": access.job_id, "attempt": access.attempt, "pid": proc.pid}
    emit(job_events.AGENT_STARTED, **who, program=program, cgroup=cgroup is not None)
    ended_by, signalled = EXITED, None
    try:
        while True:
            stop = stop_reason()
            if stop is not None:
                ended_by = stop
                break
            if proc.wait_exit(WATCH_S):
                break
            if remaining_s() <= 0:
                ended_by = DEADLINE
                break
        if ended_by != EXITED and not proc.exited():
            proc.terminate()
            signalled = "SIGTERM" if proc.wait_exit(TERM_GRACE_S) else "SIGKILL"
    finally:
        ended = proc.end()  # every process of the tree, whatever happened above
        with contextlib.suppress(OSError):
            record.unlink()
        shutil.rmtree(scratch, ignore_errors=True)
    output, truncated = proc.output()
    exit_code = _shell_status(ended.returncode)
    summary = {
        "program": program,
        "pid": proc.pid,
        "ended_by": ended_by,
        "signalled": signalled,
        "exit_code": exit_code,
        "leftovers": ended.leftovers,
        "survivors": list(ended.survivors),
        "output": output,
        "truncated": truncated,
        "duration_ms": int((time.monotonic() - proc.started) * 1000),
    }
    emit(
        job_events.AGENT_ENDED,
        **who,
        ended_by=ended_by,
        exit_code=exit_code,
        leftovers=ended.leftovers,
        survivors=list(ended.survivors),
    )
    steps, counts = calls.calls(access.job_id, access.attempt)
    failure = _failure(program, ended_by, ended.returncode, output)
    if ended.survivors:
        left = f"{len(ended.survivors)} process(es) of the agent would not die: {ended.survivors}"
        failure = f"{failure}; {left}" if failure else left
    stopped = None if ended_by in (EXITED, DEADLINE) else ended_by
    return CommandOutcome(failure, stopped, summary, steps, counts)


def _shell_status(returncode: int) -> int:
    """As a shell's ``$?`` says it: 128 + N for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _failure(program: str, ended_by: str, returncode: int, output: str) -> str | None:
    tail = output.strip()[-REASON_TAIL_CHARS:].replace("\n", " | ")
    said = f"; output ends: {tail}" if tail else ""
    if ended_by == DEADLINE:
        return f"deadline exceeded: the agent command {program} had not exited{said}"
    if ended_by != EXITED or returncode == 0:
        return None
    if returncode < 0:
        number = -returncode
        try:
            number_named = f"{number} ({signal.Signals(number).name})"
        except ValueError:
            number_named = str(number)
        return f"the agent command {program} was killed by signal {number_named}{said}"
    return f"the agent command {program} exited with code {returncode}{said}"


def end_older_agents(home: Path, job_id: str, attempt: int, emit: Emit) -> int:
    """End what is left of this job's older attempts' agents on this host (a worker that
    died leaves its agent running): returns how many processes were killed."""
    base = agents_dir(home, job_id)
    total = 0
    for record in sorted(base.glob("a*.json")):
        try:
            older = int(record.stem[1:])
            found = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if older >= attempt or not found.get("marker"):
            continue
        cgroup = Path(found["cgroup"]) if found.get("cgroup") else None
        killed = end_marked(str(found.get("marker", "")), cgroup)
        total += killed
        emit(
            job_events.AGENT_LEFTOVERS_ENDED,
            job_id=job_id,
            attempt=attempt,
            older_attempt=older,
            killed=killed,
        )
        with contextlib.suppress(OSError):
            record.unlink()
        shutil.rmtree(base / f"a{older}", ignore_errors=True)
    return total
