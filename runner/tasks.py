"""Celery tasks and worker signal hooks: thin adapters around ``runner.job``.

Enqueue with plain Celery (``run_agent_job.delay(spec_dict)``) from any client whose
app came from ``runner.celery_app.create_app``; ``runner.submit`` validates first.

Every delivery is safe to run: ``runner.job.run_job`` claims an attempt, watches a
live one, or returns a committed result (``runner.liveness``). The worker's parent
process runs the janitor (``runner.janitor``) every ``janitor_interval_s``, from
``worker_ready`` until ``worker_shutdown``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task, shared_task
from celery.signals import worker_ready, worker_shutdown

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


def _app_of(sender: Any) -> Celery | None:
    app = getattr(sender, "app", None)
    return app if getattr(app, "slotrunner_settings", None) is not None else None


@worker_ready.connect(weak=False, dispatch_uid="slotrunner.janitor.start")  # type: ignore[untyped-decorator]
def start_janitor(sender: Any = None, **_: Any) -> None:
    """Start the periodic janitor in the worker's parent process."""
    from runner.janitor import Janitor, JanitorThread
    from runner.logs import EventLog
    from runner.redis_server import connect
    from runner.slots import SlotPool

    app = _app_of(sender)
    if app is None or getattr(app, "slotrunner_janitor", None) is not None:
        return
    settings = app.slotrunner_settings
    config = getattr(app, "slotrunner_job_config", None) or JobConfig()
    client = connect(settings)
    log = EventLog(settings)
    slots = SlotPool(settings, client, log)
    slots.ensure_layout()
    thread = JanitorThread(Janitor(settings, client, log, slots), config.janitor_interval_s)
    app.slotrunner_janitor = thread
    thread.start()


@worker_shutdown.connect(weak=False, dispatch_uid="slotrunner.janitor.stop")  # type: ignore[untyped-decorator]
def stop_janitor(sender: Any = None, **_: Any) -> None:
    from celery import current_app

    app = getattr(sender, "app", None) or current_app
    thread = getattr(app, "slotrunner_janitor", None)
    if thread is not None:
        thread.stop()
