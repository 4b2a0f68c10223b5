"""The Celery app factory. Nothing connects at import time.

Acks late and reject-on-worker-lost, so a job whose worker dies is redelivered;
prefetch 1, so a worker never sits on jobs it cannot start. Redelivery is harmless
because every start takes a new attempt number that fences the older ones.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from runner.redis_server import resolve_url
from runner.settings import Settings

QUEUE = "slotrunner"
TASK_NAME = "slotrunner.run_agent_job"


def create_app(
    settings: Settings,
    *,
    redis_url: str | None = None,
    broker_options: dict[str, Any] | None = None,
) -> Celery:
    url = redis_url or resolve_url(settings)
    app = Celery("slotrunner", broker=url, set_as_current=True)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_ignore_result=True,  # results live under slotrunner:job:{id}:result
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_transport_options={"visibility_timeout": 300, **(broker_options or {})},
    )
    app.slotrunner_settings = settings  # type: ignore[attr-defined]
    app.slotrunner_redis_url = url  # type: ignore[attr-defined]
    # Importing the module registers the task with this app (shared_task).
    import runner.tasks  # noqa: F401

    return app
