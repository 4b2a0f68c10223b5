"""Celery tasks: thin adapters around ``runner.worker.job``.

Enqueue with plain Celery (``run_agent_job.delay(spec_dict)``) from any client whose
app came from ``runner.worker.celery_app.create_app``; ``runner.jobs.submit`` validates first.

Every delivery is safe to run: ``runner.worker.job.run_job`` claims an attempt, watches a
live one, or returns a committed result (``runner.worker.liveness``). The worker's parent
process runs the janitor (``runner.slots.janitor``) every ``janitor_interval_s``, from
``worker_ready`` until ``worker_shutdown``: ``hooks.celery_hooks``, which the worker
imports at start because the app names it in ``include`` (``create_app``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject
from pydantic import ValidationError

from runner.core import keys
from runner.core.ids import valid_job_id
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs import events as job_events
from runner.jobs.config import JobConfig
from runner.jobs.models import JobResult, JobSpec
from runner.jobs.queue import TASK_NAME
from runner.jobs.results import finish
from runner.jobs.submit import spec_problems
from runner.worker.context import context_for
from runner.worker.job import run_job


@shared_task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
def run_agent_job(self: Task, spec: dict[str, Any]) -> dict[str, Any]:
    app = self.app
    settings = app.slotrunner_settings
    config = getattr(app, "slotrunner_job_config", None) or JobConfig()
    floor = bool(getattr(app, "slotrunner_attempt_floor", True))
    try:
        job = JobSpec.model_validate(spec)
    except ValidationError as exc:
        return refuse_spec(settings, spec, exc)
    try:
        ctx = context_for(settings, config, attempt_floor=floor)
        result = run_job(job, ctx, worker=self.request.hostname)
        finished = bool(ctx.redis.exists(keys.job_result(result.job_id)))
    except Exception as exc:
        # Outside the job's own handling: Redis unreachable past the client's retries,
        # a slot stamp or attempt floor that cannot be made durable. Acking would lose
        # the job (no result, no queued copy), so retry the delivery with backoff; the
        # next one claims a new attempt, or watches a live one. Past the budget the job
        # fails with the error as its reason.
        retries = int(self.request.retries or 0)
        if retries < config.delivery_retries:
            countdown = min(config.delivery_retry_s * 2**retries, 60.0)
            raise self.retry(
                exc=exc, countdown=countdown, max_retries=config.delivery_retries
            ) from exc
        give_up(settings, config, job, exc, retries, attempt_floor=floor)
        raise
    if not finished:
        # This delivery ends with the job unfinished (a newer attempt superseded it).
        # Its ack would also delete the broker's record of the copy running that newer
        # attempt: kombu keys unacked deliveries by tag, and a copy restored after the
        # visibility timeout keeps its tag. Should that copy's worker then die, nothing
        # would be left to redeliver (chaos seed 15). Requeue instead: the copy watches
        # the live attempt, and takes over if it dies.
        raise Reject("superseded: the job is still running elsewhere", requeue=True)
    return {"job_id": result.job_id, "state": result.state, "attempt": result.attempt}


def refuse_spec(settings: Settings, spec: Any, exc: ValidationError) -> dict[str, Any]:
    """A spec no job can run, sent past ``runner.jobs.submit``: refused before anything is
    claimed, leased or written to Redis, with the reason on the host's log (a line, not
    a traceback); the delivery is acked, since no redelivery could make it valid."""
    given = spec.get("job_id") if isinstance(spec, dict) else None
    job_id = given if valid_job_id(given) else None
    reason = spec_problems(exc)[:1000]
    EventLog(settings).emit(job_events.JOB_SPEC_REFUSED, job_id=job_id, reason=reason)
    return {"job_id": job_id, "state": "refused", "reason": reason}


def give_up(
    settings: Settings,
    config: JobConfig,
    job: JobSpec,
    exc: Exception,
    retries: int,
    *,
    attempt_floor: bool = True,
) -> None:
    """Fail the job after its last retry, unless an attempt still runs or it finished."""
    job = job.with_job_id()
    assert job.job_id is not None
    with contextlib.suppress(Exception):  # Redis may be the very thing that is gone
        ctx = context_for(settings, config, attempt_floor=attempt_floor)
        if ctx.redis.exists(keys.job_heartbeat(job.job_id)):
            return  # a live attempt will commit its own result
        current = int(ctx.redis.get(keys.job_attempt(job.job_id)) or 0)
        reason = (
            f"internal error in {retries + 1} deliveries, the last: {type(exc).__name__}: {exc}"
        )
        finish(
            ctx.redis,
            ctx.log,
            JobResult(job_id=job.job_id, state="failed", attempt=current, reason=reason[:1000]),
        )
