"""The slotrunner Celery app for Celery's own tooling (docs/architecture.md §Several hosts).

    celery -A runner.celery_app inspect ping
    celery -A runner.celery_app worker --loglevel INFO
    celery -A runner.celery_app events
    celery -A runner.celery_app flower

Celery's ``-A MODULE`` takes the module's ``app`` (else ``celery``) attribute. Both
names are built on first use, from the environment, by the same factory as
``slotrunner worker`` (``runner.worker.celery_app.create_app`` with
``Settings.from_env()``), so a worker started either way consumes the same queue with
the same options, janitor and host beat. Importing this module reads no setting and
opens no connection (a module ``__getattr__``): a process that only imports it, to
send tasks or for its type, starts nothing, and an unset ``REDIS_URL`` starts the
embedded Redis only when the app is first used.

A worker started by ``celery -A runner.celery_app worker`` refuses an evicting Redis
as ``slotrunner worker`` does (:class:`Preflight`, a worker bootstep), before it takes
any job.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery, bootsteps
from celery.platforms import EX_FAILURE
from celery.utils.log import get_logger

logger = get_logger(__name__)
_lock = threading.Lock()
_built: list[Celery] = []


def get_app() -> Celery:
    """The app, built once per process on first use."""
    with _lock:
        if not _built:
            from runner.core.settings import Settings
            from runner.worker.celery_app import create_app

            app = create_app(Settings.from_env())
            app.steps["worker"].add(Preflight)
            _built.append(app)
        return _built[0]


def __getattr__(name: str) -> Celery:
    if name in ("app", "celery"):
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Preflight(bootsteps.StartStopStep):  # type: ignore[misc]
    """``slotrunner worker``'s check of its Redis (``runner/worker/preflight.py``), for
    a worker started by Celery's own command. Started before the consumer (Celery
    starts that step last), so no job is taken from a Redis that may evict our keys."""

    def start(self, worker: Any) -> None:
        from runner.redis_server import connect
        from runner.worker.preflight import PreflightError, check_redis

        try:
            warnings = check_redis(connect(worker.app.slotrunner_settings))
        except PreflightError as exc:
            logger.critical("slotrunner: refusing to start: %s", exc)
            raise SystemExit(EX_FAILURE) from None
        for warning in warnings:
            logger.warning("slotrunner: %s", warning)
