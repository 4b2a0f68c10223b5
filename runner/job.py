"""One attempt of one job, as a plain function (the Celery task only adapts it).

attempt fence -> lease a slot -> prepare the tree (start snapshot) -> agent loop ->
end snapshot -> release the slot (exactly once, in ``finally``) -> commit the
result, only if this attempt is still the job's current one.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

import redis

from runner import events, keys
from runner.agent import AgentRun, ScriptedSteps
from runner.logs import EventLog
from runner.models import JobResult, JobSpec, ScriptedPlanner
from runner.redis_server import connect
from runner.settings import Settings
from runner.slots import NoSlotFree, ReleaseRefused, SlotPool
from runner.workspace import WorkspaceError, Workspaces
from tools.builtin import write_job
from tools.client import ToolClient

# Commit the result only when the caller is still the job's current attempt and no
# result exists yet: a superseded attempt can finish its work but never its result.
_COMMIT = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], ARGV[3])
return 1
"""

SLOT_WAIT_S = 30.0


@dataclass
class WorkerContext:
    """What a worker process builds once and every job attempt reuses."""

    settings: Settings
    redis: redis.Redis
    log: EventLog
    slots: SlotPool
    workspaces: Workspaces
    client: ToolClient

    @classmethod
    def build(cls, settings: Settings) -> WorkerContext:
        client = connect(settings)
        log = EventLog(settings)
        return cls(
            settings,
            client,
            log,
            SlotPool(settings, client, log),
            Workspaces(settings.home),
            ToolClient(settings.toolserver_url, token=settings.token),
        )


_CONTEXTS: dict[int, WorkerContext] = {}


def context_for(settings: Settings) -> WorkerContext:
    """One context per process: connections are never shared across a fork."""
    pid = os.getpid()
    ctx = _CONTEXTS.get(pid)
    if ctx is None or ctx.settings != settings:
        ctx = _CONTEXTS[pid] = WorkerContext.build(settings)
    return ctx


def commit_result(client: redis.Redis, result: JobResult) -> bool:
    script = client.register_script(_COMMIT)
    committed = script(
        keys=[
            keys.job_attempt(result.job_id),
            keys.job_result(result.job_id),
            keys.job_state(result.job_id),
        ],
        args=[result.attempt, result.model_dump_json(), result.state],
    )
    return bool(committed == 1)


def run_job(spec: JobSpec, ctx: WorkerContext) -> JobResult:
    spec = spec.with_job_id()
    job_id = spec.job_id
    assert job_id is not None
    attempt = int(ctx.redis.incr(keys.job_attempt(job_id)))
    ctx.redis.set(keys.job_state(job_id), "running")
    ctx.log.emit(events.JOB_STARTED, job_id=job_id, attempt=attempt)
    try:
        stamp = ctx.slots.lease(job_id, attempt, wait_s=min(SLOT_WAIT_S, spec.deadline_s))
    except NoSlotFree as exc:
        return _finish(
            ctx,
            JobResult(job_id=job_id, state="rejected", attempt=attempt, reason=f"no_slot: {exc}"),
        )
    slot_dir = ctx.settings.slots_dir / stamp.slot_id
    result: dict[str, Any] = {
        "job_id": job_id,
        "attempt": attempt,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
    }
    try:
        write_job(
            slot_dir,
            {
                "job_id": job_id,
                "generation": stamp.generation,
                "test_command": spec.test_command,
                "test_timeout_s": spec.test_timeout_s,
            },
        )
        prepared = ctx.workspaces.prepare(slot_dir, spec.repo, spec.base, job_id)
        if not isinstance(spec.planner, ScriptedPlanner):
            raise NotImplementedError("only the scripted planner runs in this build")
        run = AgentRun(spec, stamp, slot_dir, ctx.client)
        records = run.run(ScriptedSteps(spec.planner))
        _, end_tree = ctx.workspaces.snapshot(slot_dir, job_id, "end")
        failed = [r for r in records if r.outcome in ("failed", "refused", "unknown")]
        result.update(
            state="failed" if failed else "succeeded",
            final_tree=end_tree,
            diff=ctx.workspaces.diff(slot_dir, prepared.base_commit),
            steps=[r.model_dump() for r in records],
            counts=run.counts.model_dump(),
            reason=f"step {failed[0].index} {failed[0].tool}: {failed[0].detail}"
            if failed
            else None,
            sandbox=_sandbox_mode(records),
        )
    except (WorkspaceError, NotImplementedError) as exc:
        result.update(state="failed", reason=str(exc))
    finally:
        # A refused release means a reclaim already took the slot back; it is logged there.
        with contextlib.suppress(ReleaseRefused):
            ctx.slots.release(stamp.slot_id, job_id, stamp.generation)
    return _finish(ctx, JobResult.model_validate(result))


def _sandbox_mode(records: list[Any]) -> str | None:
    for record in records:
        if record.tool == "run_tests" and record.result and "sandbox" in record.result:
            return str(record.result["sandbox"])
    return None


def _finish(ctx: WorkerContext, result: JobResult) -> JobResult:
    committed = commit_result(ctx.redis, result)
    ctx.log.emit(
        events.JOB_FINISHED,
        job_id=result.job_id,
        attempt=result.attempt,
        state=result.state,
        committed=committed,
        reason=result.reason,
    )
    return result


def load_result(client: redis.Redis, job_id: str) -> JobResult | None:
    raw = client.get(keys.job_result(job_id))
    if raw is None:
        return None
    return JobResult.model_validate(json.loads(raw))
