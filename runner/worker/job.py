"""One delivery of one job, as a plain function (the Celery task only adapts it).

claim an attempt (``runner.worker.liveness``: a delivery that finds the result committed
returns it, one that finds a live attempt watches it until it ends or goes silent)
-> heartbeat thread (renews the heartbeat and the slot lease) -> the attempt
(``runner.worker.attempt``) -> its result committed while the heartbeat still lives -> end
the heartbeat.
"""

from __future__ import annotations

import os
from typing import Any

from runner.core import events, keys
from runner.jobs import events as job_events
from runner.jobs.models import JobResult, JobSpec
from runner.jobs.results import load_result
from runner.slots.lease_keeper import LeaseKeeper
from runner.worker.attempt import Attempt
from runner.worker.context import WorkerContext
from runner.worker.liveness import Finished, Heartbeat, Liveness, acquire


def run_job(spec: JobSpec, ctx: WorkerContext, *, worker: str | None = None) -> JobResult:
    """Run (or watch, or skip) one delivery of ``spec``; the job's result either way."""
    spec = spec.with_job_id()
    job_id = spec.job_id
    assert job_id is not None
    who: dict[str, Any] = {"pid": os.getpid(), "worker": worker}
    liveness = Liveness(ctx.redis, job_id, ctx.config, home=ctx.floor_home)
    while True:
        claimed = acquire(liveness, ctx.log, **who)
        if not isinstance(claimed, Finished):
            break
        found = load_result(ctx.redis, job_id)
        if found is None:
            # Committed when the claim looked, gone when read: Redis lost its data in
            # between. Claim again (the attempt floor keeps the numbers growing).
            continue
        ctx.log.emit(job_events.JOB_ALREADY_FINISHED, job_id=job_id, state=found.state, **who)
        return found
    attempt = claimed.attempt
    ctx.redis.set(keys.job_state(job_id), "running")
    ctx.log.emit(
        events.JOB_STARTED,
        job_id=job_id,
        attempt=attempt,
        took_over_from=claimed.took_over_from,
        **who,
    )
    keeper = LeaseKeeper(ctx.slots, ctx.settings.lease_ttl_s)
    with Heartbeat(liveness, attempt, ctx.log, on_tick=keeper.renew_if_due) as beat:
        # The result is committed while the heartbeat still lives, so no watchdog
        # takes over a job that is merely between its release and its commit.
        return Attempt(spec, ctx, liveness, beat, keeper, claimed).run()
