"""Celery tasks: thin adapters around ``runner.job``.

Enqueue with plain Celery (``run_agent_job.delay(spec_dict)``) from any client whose
app came from ``runner.celery_app.create_app``; ``runner.submit`` validates first.

Every delivery is safe to run: ``runner.job.run_job`` claims an attempt, watches a
live one, or returns a committed result (``runner.liveness``). The worker's parent
process runs the janitor (``runner.janitor``) every ``janitor_interval_s``, from
``worker_ready`` until ``worker_shutdown`` (``hooks.celery_hooks``).
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

import hooks.celery_hooks  # noqa: F401  (connects the worker signal hooks: the janitor)
from runner import keys
from runner.celery_app import TASK_NAME
from runner.job import context_for, run_job
from runner.job_config import JobConfig
from runner.models import JobSpec


@shared_task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
def run_agent_job(self: Task, spec: dict[str, Any]) -> dict[str, Any]:
    app = self.app
    settings = app.slotrunner_settings
    config = getattr(app, "slotrunner_job_config", None) or JobConfig()
    ctx = context_for(settings, config)
    result = run_job(JobSpec.model_validate(spec), ctx, worker=self.request.hostname)
    if not ctx.redis.exists(keys.job_result(result.job_id)):
        # This delivery ends with the job unfinished (a newer attempt superseded it).
        # Its ack would also delete the broker's record of the copy running that newer
        # attempt: kombu keys unacked deliveries by tag, and a copy restored after the
        # visibility timeout keeps its tag. Should that copy's worker then die, nothing
        # would be left to redeliver (chaos seed 15). Requeue instead: the copy watches
        # the live attempt, and takes over if it dies.
        raise Reject("superseded: the job is still running elsewhere", requeue=True)
    return {"job_id": result.job_id, "state": result.state, "attempt": result.attempt}
