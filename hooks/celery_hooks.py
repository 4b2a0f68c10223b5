"""Celery signal hooks of a slotrunner worker: the janitor runs in the parent process.

``worker_ready`` starts a :class:`runner.slots.janitor.JanitorThread` that reclaims slots
whose attempt is superseded or silent (after settling their open intents from the
tree), and a :class:`runner.slots.host_beat.HostBeatThread` that publishes the host's
beat and heals its slots' views for ``slots list --pool``; ``worker_shutdown`` stops
both. Connected when the worker imports this module at
start: ``runner.worker.celery_app.create_app`` names it in Celery's ``include``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from runner.jobs.config import JobConfig


def _app_of(sender: Any) -> Celery | None:
    app = getattr(sender, "app", None)
    return app if getattr(app, "slotrunner_settings", None) is not None else None


@worker_ready.connect(weak=False, dispatch_uid="slotrunner.janitor.start")  # type: ignore[untyped-decorator]
def start_janitor(sender: Any = None, **_: Any) -> None:
    """Start the periodic janitor in the worker's parent process."""
    from runner.core.logs import EventLog
    from runner.redis_server import connect
    from runner.slots.host_beat import HostBeat, HostBeatThread
    from runner.slots.janitor import Janitor, JanitorThread
    from runner.slots.pool import SlotPool

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
    interval_s = config.janitor_interval_s
    beat = HostBeatThread(HostBeat(settings, client, slots, log, interval_s=interval_s))
    app.slotrunner_host_beat = beat
    beat.start()


@worker_shutdown.connect(weak=False, dispatch_uid="slotrunner.janitor.stop")  # type: ignore[untyped-decorator]
def stop_janitor(sender: Any = None, **_: Any) -> None:
    from celery import current_app

    app = getattr(sender, "app", None) or current_app
    for name in ("slotrunner_janitor", "slotrunner_host_beat"):
        thread = getattr(app, name, None)
        if thread is not None:
            thread.stop()
