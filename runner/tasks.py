"""Celery tasks: thin adapters around ``runner.job``.

Enqueue with plain Celery (``run_agent_job.delay(spec_dict)``) from any client whose
app came from ``runner.celery_app.create_app``; ``runner.submit`` validates first.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from runner.celery_app import TASK_NAME
from runner.job import context_for, run_job
from runner.models import JobSpec


@shared_task(name=TASK_NAME, bind=True)
def run_agent_job(self: Task, spec: dict[str, Any]) -> dict[str, Any]:
    settings = self.app.slotrunner_settings
    result = run_job(JobSpec.model_validate(spec), context_for(settings))
    return {"job_id": result.job_id, "state": result.state, "attempt": result.attempt}
