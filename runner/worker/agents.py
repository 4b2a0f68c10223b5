"""What an attempt adds for agents of one's own (docs/architecture.md §Agents, §Gateway).

- The gateway credential of a ``python`` or ``command`` planner with a ``model`` block:
  minted before any slot is leased (:func:`mint_for`), for the job's eval-run, job,
  attempt and upstream, living as long as the job's deadline, and revoked when the
  attempt ends (:func:`revoke`). A python agent gets it as ``Workspace.gateway_url``
  and ``gateway_key``, a command agent in its environment (``runner.agent.command``).
- The ``command`` kind's checks before leasing (:func:`command_problem`: its program
  can be found; what an older attempt's agent left on this host is ended) and its
  drive (:func:`drive_command`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import redis

from runner.agent.command import (
    AgentAccess,
    CommandError,
    CommandOutcome,
    agent_env,
    end_older_agents,
    find_program,
    run_command,
)
from runner.agent.loop import AgentRun
from runner.gateway.credentials import Credential, mint_credential, revoke_credential
from runner.jobs.models import CommandPlanner, JobSpec, ModelAccess, PythonPlanner
from runner.worker.context import WorkerContext


def model_block(spec: JobSpec) -> ModelAccess | None:
    planner = spec.planner
    return planner.model if isinstance(planner, PythonPlanner | CommandPlanner) else None


def mint_for(ctx: WorkerContext, spec: JobSpec, attempt: int, ttl_s: float) -> Credential | None:
    """The attempt's gateway credential, or None without a model block; ValueError
    (pydantic's) for a grant the gateway could not use (the job is rejected)."""
    model = model_block(spec)
    if model is None:
        return None
    assert spec.job_id is not None
    return mint_credential(
        ctx.redis,
        gateway_url=ctx.settings.gateway_url,
        ttl_s=ttl_s,
        eval_run=spec.eval_run,
        job_id=spec.job_id,
        attempt=attempt,
        upstream=model.base_url,
        bound=model.admission_bound,
        api_key_env=model.api_key_env,
        request_timeout_s=model.request_timeout_s,
        admission_wait_s=model.admission_wait_s,
    )


def revoke(ctx: WorkerContext, credential: Credential | None) -> None:
    """End the credential now; one Redis cannot be reached for still expires at its TTL."""
    if credential is not None:
        with contextlib.suppress(redis.RedisError):
            revoke_credential(ctx.redis, credential.secret)


def command_problem(ctx: WorkerContext, spec: JobSpec, attempt: int) -> str | None:
    """Before leasing: why the command cannot run (the job is rejected), or None; and
    what an older attempt's agent of this job left running on this host is ended."""
    planner = spec.planner
    assert isinstance(planner, CommandPlanner) and spec.job_id is not None
    end_older_agents(ctx.settings.home, spec.job_id, attempt, ctx.log.emit)
    try:
        find_program(planner, agent_env(planner, AgentAccess(spec.job_id, attempt, None)))
    except CommandError as exc:
        return str(exc)
    return None


def drive_command(
    ctx: WorkerContext,
    run: AgentRun,
    access: AgentAccess,
    stop_reason: Callable[[], str | None],
) -> CommandOutcome:
    """Run the job's command agent over ``run`` until it and its tree are gone; its calls
    (read back from the host log) become the run's records and counts."""
    planner = run.spec.planner
    assert isinstance(planner, CommandPlanner)
    outcome = run_command(
        planner,
        access,
        home=ctx.settings.home,
        log_path=ctx.settings.log_path,
        remaining_s=run.remaining_s,
        stop_reason=stop_reason,
        emit=ctx.log.emit,
    )
    run.stopped = run.stopped or outcome.stopped
    run.records.extend(outcome.steps)
    run.counts = outcome.counts
    return outcome
