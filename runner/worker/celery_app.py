"""The Celery app factory. Nothing connects at import time.

Acks late and reject-on-worker-lost, so a job whose worker dies is redelivered;
prefetch 1, so a worker never sits on jobs it cannot start. Redelivery is harmless:
a copy that finds the job's attempt alive watches it instead of starting a second
one, and every new attempt fences the older ones (``runner.worker.liveness``). So the
broker's visibility timeout can be minutes, not hours, and a job whose whole worker
died resumes within visibility timeout + heartbeat TTL.

Environment read here (the factory is an edge, like ``Settings.from_env``):

    SLOTRUNNER_VISIBILITY_TIMEOUT_S    300  kombu's visibility timeout (Redis broker)
    plus the job timing knobs of ``runner.jobs.config``.

Nothing else changes a worker's behaviour, and no environment variable switches a
safety check off. A test that needs other broker options (a quick restore of unacked
deliveries) or runs without the attempt floor builds its app with the arguments of
:func:`create_app`, in a worker process of its own (``ops.testing.worker``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from runner.core.settings import Settings
from runner.jobs.config import JobConfig, seconds
from runner.jobs.queue import QUEUE
from runner.redis_server import resolve_url

VISIBILITY_TIMEOUT_S = 300.0
# Imported by the worker at start (Celery's ``include``), never by this module: the
# task, and the signal hooks that run the janitor in the worker's parent process.
# Named, not imported, because hooks sit above the runner.
WORKER_MODULES = ("runner.worker.tasks", "hooks.celery_hooks")


def broker_transport_options(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        "visibility_timeout": seconds(env, "SLOTRUNNER_VISIBILITY_TIMEOUT_S", VISIBILITY_TIMEOUT_S)
    }


def create_app(
    settings: Settings,
    *,
    redis_url: str | None = None,
    broker_options: dict[str, Any] | None = None,
    job_config: JobConfig | None = None,
    env: Mapping[str, str] | None = None,
    attempt_floor: bool = True,
) -> Celery:
    """The slotrunner app, for a client (it only sends) and for a worker.

    ``broker_options`` are added to kombu's transport options (over the visibility
    timeout of the environment). ``attempt_floor=False`` runs this app's jobs on the
    Redis attempt counter alone, without the host's floor and kept results
    (``runner.worker.liveness``): only the chaos campaign's control run does, to show
    that its check catches the attempt numbers a Redis wipe then reissues.
    """
    env = os.environ if env is None else env
    url = redis_url or resolve_url(settings)
    app = Celery("slotrunner", broker=url, set_as_current=True, include=list(WORKER_MODULES))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_ignore_result=True,  # results live under slotrunner:job:{id}:result
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        # A lost broker connection leaves running jobs running: their messages stay
        # unacked and come back after the visibility timeout as copies that find the
        # live heartbeat and only watch it (runner/worker/liveness.py). Killing them would
        # throw work away for a blip. Said explicitly: Celery warns when it is unset.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_transport_options={**broker_transport_options(env), **(broker_options or {})},
    )
    app.slotrunner_settings = settings
    app.slotrunner_redis_url = url
    app.slotrunner_job_config = job_config or JobConfig.from_env(env)
    app.slotrunner_attempt_floor = attempt_floor
    return app


def worker_argv(
    settings: Settings, *, concurrency: int, pool: str, loglevel: str, hostname: str | None
) -> list[str]:
    """The arguments of ``app.worker_main`` for a worker consuming the job queue."""
    return [
        "worker",
        *("-Q", QUEUE),
        *("--concurrency", str(concurrency)),
        *("--pool", pool),
        *("--loglevel", loglevel),
        "--without-mingle",
        "--without-gossip",
        *("-n", hostname or f"slotrunner-{settings.host}@%h"),
    ]
