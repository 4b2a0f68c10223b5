"""What a worker process builds once and every job attempt reuses (``WorkerContext``).

``runner.worker.job`` runs one delivery with it, ``runner.worker.attempt`` one attempt;
the Celery task (``runner.worker.tasks``) gets the process's own through
:func:`context_for`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import redis

from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs.config import JobConfig
from runner.redis_server import connect
from runner.slots.janitor import Janitor
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tools.client import ToolClient


@dataclass
class WorkerContext:
    """What a worker process builds once and every job attempt reuses."""

    settings: Settings
    redis: redis.Redis
    log: EventLog
    slots: SlotPool
    workspaces: Workspaces
    client: ToolClient
    config: JobConfig = field(default_factory=JobConfig)
    janitor: Janitor | None = None
    # False: attempts rest on the Redis counter alone, without this host's attempt
    # floor and kept results (see ``runner.worker.celery_app.create_app``).
    attempt_floor: bool = True

    @property
    def floor_home(self) -> Path | None:
        """The home whose attempt floors and kept results the claims use (None: none)."""
        return self.settings.home if self.attempt_floor else None

    @classmethod
    def build(
        cls, settings: Settings, config: JobConfig | None = None, *, attempt_floor: bool = True
    ) -> WorkerContext:
        client = connect(settings)
        log = EventLog(settings)
        slots = SlotPool(settings, client, log)
        return cls(
            settings,
            client,
            log,
            slots,
            Workspaces(settings.home),
            ToolClient(settings.toolserver_url, token=settings.token),
            config or JobConfig(),
            Janitor(settings, client, log, slots),
            attempt_floor,
        )


_CONTEXTS: dict[int, WorkerContext] = {}


def context_for(
    settings: Settings, config: JobConfig | None = None, *, attempt_floor: bool = True
) -> WorkerContext:
    """One context per process: connections are never shared across a fork."""
    pid = os.getpid()
    config = config or JobConfig()
    ctx = _CONTEXTS.get(pid)
    if (
        ctx is None
        or ctx.settings != settings
        or ctx.config != config
        or ctx.attempt_floor != attempt_floor
    ):
        ctx = _CONTEXTS[pid] = WorkerContext.build(settings, config, attempt_floor=attempt_floor)
    return ctx
