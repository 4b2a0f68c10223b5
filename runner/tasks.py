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

import hooks.celery_hooks  # noqa: F401  (connects the worker signal hooks: the janitor)
from runner.celery_app import TASK_NAME
from runner.job import context_for, run_job
from runner.job_config import JobConfig
from runner.models import JobSpec


@shared_task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]
def run_agent_job(self: Task, spec: dict[str, Any]) -> dict[str, Any]:
    app = self.app
    settings = app.slotrunner_settings
    config = getattr(app, "slotrunner_job_config", None) or JobConfig()
    result = run_job(
        JobSpec.model_validate(spec), context_for(settings, config), worker=self.request.hostname
    )
    return {"job_id": result.job_id, "state": result.state, "attempt": result.attempt}
