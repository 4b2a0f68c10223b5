"""A host's beat in the shared Redis: "this host is up, here are its slots"
(docs/architecture.md §Several hosts).

Every worker of a host beats from its parent process (a daemon thread started on
Celery's ``worker_ready``, ``hooks/celery_hooks.py``), every
``SLOTRUNNER_JANITOR_INTERVAL_S``. A beat

1. writes each slot's view again where it differs from the slot's stamp
   (``runner/slots/pool_view.py``): a copy lost to a Redis blip, or a stamp the tool
   server changed (it has no Redis), is right again one beat later;
2. writes ``keys.host_beat`` (last beat, slot count, tool server URL) and sets
   ``keys.host_alive`` with a TTL of three beats.

A host whose alive key expired is shown ``dead`` by ``slots list --pool``. The TTL is
counted by Redis's clock, so a reader never compares its own clock with a writer's:
skew between hosts changes only the "last beat 42s ago" it prints. Nothing decides
anything from the beat: a dead host's jobs move by the job heartbeat and redelivery
(``runner/worker/liveness.py``), and its slots are settled by its own janitor when it
comes back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
from filelock import Timeout

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import StampError, iso, read_stamp
from runner.jobs import events as job_events
from runner.slots import pool_view
from runner.slots.pool import SlotPool

# A host is dead after this many beats missed in a row.
MISSED_BEATS = 3


class HostBeat:
    """One host's beat. ``clock`` (epoch seconds) and ``dead_after_s`` are seams: a
    test writes a beat from the past, or one that expires at once."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        slots: SlotPool,
        log: EventLog,
        *,
        interval_s: float,
        dead_after_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.redis = client
        self.slots = slots
        self.log = log
        self.interval_s = interval_s
        self.dead_after_s = MISSED_BEATS * interval_s if dead_after_s is None else dead_after_s
        self.clock = clock

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def beat(self) -> int:
        """Heal the slot views, then beat; returns how many views were written."""
        healed = self.heal()
        host = self.settings.host
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            keys.host_beat(host),
            mapping={
                "beat_at": iso(self._now()),
                "slots": str(self.settings.slots),
                "toolserver_url": self.settings.toolserver_url,
                "interval_s": repr(self.interval_s),
                "dead_after_s": repr(self.dead_after_s),
            },
        )
        pipe.set(keys.host_alive(host), "1", px=max(1, round(self.dead_after_s * 1000)))
        pipe.sadd(keys.HOSTS, host)
        pipe.execute()
        return healed

    def heal(self) -> int:
        """Rewrite every slot view that differs from its stamp (one read for all)."""
        host = self.settings.host
        ids = self.slots.slot_ids()
        pipe = self.redis.pipeline(transaction=False)
        for slot_id in ids:
            pipe.hgetall(keys.slot_view(host, slot_id))
        copies: list[dict[str, str]] = pipe.execute()
        now = self._now()
        stale = []
        for slot_id, copy in zip(ids, copies, strict=True):
            path = self.settings.slots_dir / slot_id
            try:
                stamp = read_stamp(path)
            except StampError:
                continue  # unreadable: an operator's problem, shown by `slots list`
            if stamp is not None and pool_view.differs(stamp, copy, now):
                stale.append(slot_id)
        healed = 0
        for slot_id in stale:
            path = self.settings.slots_dir / slot_id
            # Under the lock, as every change writes its copy: a copy written now can
            # never overwrite a newer one. A busy slot waits for the next beat.
            with contextlib.suppress(Timeout, StampError), slot_lock(path, timeout_s=0):
                stamp = read_stamp(path)
                if stamp is not None and pool_view.publish(self.redis, host, stamp, now, self.log):
                    healed += 1
        return healed


class HostBeatThread:
    """The beat of a worker's parent process (started on ``worker_ready``)."""

    def __init__(self, beat: HostBeat) -> None:
        self.host_beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slotrunner-host-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.host_beat.interval_s + 5)

    def _run(self) -> None:
        while True:
            try:
                self.host_beat.beat()
            except Exception as exc:  # a Redis blip: the next beat tries again
                with contextlib.suppress(Exception):
                    error = f"{type(exc).__name__}: {exc}"
                    self.host_beat.log.emit(job_events.HOST_BEAT_ERROR, error=error)
            if self._stop.wait(self.host_beat.interval_s):
                return
