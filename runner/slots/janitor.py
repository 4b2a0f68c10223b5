"""The janitor: give back slots that no running attempt will ever release (I7).

A slot is *stale* (:func:`stale_reason`, pure) when its lease's attempt was
superseded by a newer attempt of its job, or when that attempt is not heartbeating
and its lease expired (or a reclaim of it was interrupted, or the job already
committed its result). A lease whose attempt still heartbeats is never taken back on
the clock alone: a long ``run_tests`` may hold the slot lock past the lease's expiry,
and the job renews the lease as soon as the call returns.

A stale slot is reclaimed under its lock, which the tool server holds during every
check-and-apply, so no call of the old lease is half-applied while we look:

1. state -> ``outcome_unknown`` (durable: a janitor that dies here is resumed by the
   next sweep, which finds the same slot stale for the same reason);
2. each open intent of that lease (its job and generation) is resolved from the tree
   (``tools.receipts.resolve.observe``): ``applied`` when the tree shows the effect, else
   ``failed`` ("not applied") -- final, because the lease's generation dies next and
   no envelope of it will ever be accepted again; each is logged ``receipt_resolved``;
3. a new generation (max(local stamp, Redis mirror) + 1) and state ``idle``, logged
   ``slot_reclaimed``. A later call of the old attempt is refused
   (``stale_generation``/``slot_job_mismatch``), and the next lease gets a fresh tree.

A failed receipt write poisons the slot instead (``slot_poisoned``): its fate is
unknown and an operator must look.

Where it runs (a sweep takes no lock it would wait for: a busy slot is skipped and
retried on the next sweep):

* in every worker's parent process, a daemon thread started on Celery's
  ``worker_ready`` signal, every ``SLOTRUNNER_JANITOR_INTERVAL_S`` (``runner.worker.celery_app``);
* at the start of every job attempt, before it leases a slot;
* while a job waits for a free slot, about once a second, so a slot left by a dead
  attempt is recycled to the job waiting for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import redis
from filelock import Timeout

from runner.core import events, keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import SlotState, Stamp, StampError, read_stamp, utc_now, write_stamp
from runner.jobs import events as job_events
from runner.slots.pool import SlotPool, mark
from tools import builtin
from tools.errors import ToolError
from tools.receipts.resolve import judged, observe
from tools.receipts.store import ReceiptStore, Status

SUPERSEDED = "superseded"
LEASE_EXPIRED = "lease_expired"
OUTCOME_UNKNOWN = "outcome_unknown"
JOB_FINISHED = "job_finished"
OWNERLESS = "ownerless"


@dataclass(frozen=True)
class Owner:
    """What Redis says about the job holding a lease."""

    current_attempt: int | None  # None: no attempt key (a CLI lease, or Redis lost it)
    live_attempt: int | None  # the attempt whose heartbeat is live, if any
    finished: bool  # the job's result is committed


def stale_reason(stamp: Stamp, now: datetime, owner: Owner | None) -> str | None:
    """Why this slot must be reclaimed, or None while its lease may still be in use."""
    if not stamp.lease_open():
        return None
    if stamp.job_id is None or owner is None:
        return OWNERLESS
    if (
        stamp.attempt is not None
        and owner.current_attempt is not None
        and stamp.attempt < owner.current_attempt
    ):
        return SUPERSEDED
    if owner.live_attempt is not None and owner.live_attempt == stamp.attempt:
        return None  # alive: capacity comes back by its own release, never on the clock
    if stamp.state == SlotState.OUTCOME_UNKNOWN:
        return OUTCOME_UNKNOWN  # an interrupted reclaim: finish it
    if stamp.is_expired(now):
        return LEASE_EXPIRED
    if owner.finished:
        return JOB_FINISHED
    return None


@dataclass(frozen=True)
class Reclaimed:
    slot_id: str
    job_id: str | None
    attempt: int | None
    generation: int
    new_generation: int | None  # None when the slot was poisoned instead
    reason: str
    resolved: dict[str, str] = field(default_factory=dict)  # key -> applied|not_applied


class Janitor:
    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        log: EventLog,
        slots: SlotPool,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.redis = client
        self.log = log
        self.slots = slots
        self.clock = clock
        self.monotonic = monotonic
        self._stores: dict[str, ReceiptStore] = {}
        self._last_sweep = float("-inf")
        self._lock = threading.Lock()

    def maybe_sweep(self, interval_s: float) -> list[Reclaimed]:
        """A sweep, unless this janitor swept less than ``interval_s`` ago."""
        if self.monotonic() - self._last_sweep < interval_s:
            return []
        return self.sweep()

    def sweep(self, *, lock_timeout_s: float = 0.0) -> list[Reclaimed]:
        """Reclaim every stale slot of this host whose lock is free within the timeout."""
        with self._lock:
            self._last_sweep = self.monotonic()
            done = []
            for slot_id in self.slots.slot_ids():
                path = self.settings.slots_dir / slot_id
                try:
                    stamp = read_stamp(path)
                except StampError:
                    continue  # unreadable: an operator's problem, never guessed at
                if stamp is None or self._reason(stamp) is None:
                    continue  # cheap look without the lock; decided again under it
                with contextlib.suppress(Timeout):
                    with slot_lock(path, timeout_s=lock_timeout_s):
                        reclaimed = self._reclaim_locked(path)
                    if reclaimed is not None:
                        done.append(reclaimed)
            return done

    def _owner(self, job_id: str) -> Owner:
        current, live, finished = self.redis.mget(
            keys.job_attempt(job_id), keys.job_heartbeat(job_id), keys.job_result(job_id)
        )
        return Owner(
            current_attempt=int(current) if current is not None else None,
            live_attempt=int(live) if live is not None else None,
            finished=finished is not None,
        )

    def _reason(self, stamp: Stamp) -> str | None:
        owner = self._owner(stamp.job_id) if stamp.job_id is not None else None
        return stale_reason(stamp, self.clock(), owner)

    def _store(self, slot_id: str, path: Path) -> ReceiptStore:
        store = self._stores.get(slot_id)
        if store is None:
            store = self._stores[slot_id] = ReceiptStore(path)
        return store

    def _reclaim_locked(self, path: Path) -> Reclaimed | None:
        """Steps 1-3 of the module docstring; the caller holds the slot lock."""
        stamp = read_stamp(path)
        if stamp is None:
            return None
        reason = self._reason(stamp)  # again: the stamp or Redis may have moved
        if reason is None:
            return None
        slot_id = path.name
        mark(path, SlotState.OUTCOME_UNKNOWN, f"reclaiming: {reason}")
        try:
            resolved = self._resolve_intents(path, stamp, reason)
        except ToolError as exc:
            poisoned = mark(
                path, SlotState.POISONED, f"janitor could not close a receipt: {exc.message}"
            )
            self.slots.publish_view(poisoned)
            self.log.emit(events.SLOT_POISONED, slot_id=slot_id, reason=exc.message)
            return Reclaimed(
                slot_id, stamp.job_id, stamp.attempt, stamp.generation, None, reason, {}
            )
        current = read_stamp(path)
        generation = self.slots.next_generation(slot_id, current)
        idle = Stamp(slot_id=slot_id, host=self.settings.host, generation=generation)
        # Local first, then the mirror: the same order as a lease (I5).
        write_stamp(path, idle)
        self.slots.publish_generation(slot_id, generation)
        self.slots.publish_view(idle)
        self.log.emit(
            events.SLOT_RECLAIMED,
            slot_id=slot_id,
            generation=stamp.generation,
            job_id=stamp.job_id,
            attempt=stamp.attempt,
            new_generation=generation,
            reason=reason,
            intents_applied=sum(1 for r in resolved.values() if r == "applied"),
            intents_not_applied=sum(1 for r in resolved.values() if r != "applied"),
        )
        return Reclaimed(
            slot_id, stamp.job_id, stamp.attempt, stamp.generation, generation, reason, resolved
        )

    def _resolve_intents(self, path: Path, stamp: Stamp, reason: str) -> dict[str, str]:
        store = self._store(path.name, path)
        ctx = builtin.Context(path, self.settings)
        resolved: dict[str, str] = {}
        for intent in store.open_intents():
            # Only the dying lease's intents: an older lease's tree is long gone, so
            # looking at today's tree would prove nothing about it.
            if intent.job_id != stamp.job_id or intent.generation != stamp.generation:
                continue
            if observe(ctx, intent):
                store.finish(intent, Status.APPLIED, detail="resolved_from_tree")
                resolution = "applied"
            elif not judged(intent.tool):
                # An exec may have run, in part or whole: no tree says (§Exec tool).
                resolution = "outcome_unknown"
                store.finish(
                    intent, Status.FAILED, detail=f"{resolution}: slot reclaimed ({reason})"
                )
            else:
                detail = f"not_applied: slot reclaimed ({reason})"
                store.finish(intent, Status.FAILED, detail=detail)
                resolution = "not_applied"
            resolved[intent.key] = resolution
            self.log.emit(
                events.RECEIPT_RESOLVED,
                slot_id=path.name,
                key=intent.key,
                tool=intent.tool,
                job_id=intent.job_id,
                generation=intent.generation,
                resolution=resolution,
                by="janitor",
            )
        return resolved


class JanitorThread:
    """The periodic sweep of a worker's parent process (started on ``worker_ready``)."""

    def __init__(self, janitor: Janitor, interval_s: float) -> None:
        self.janitor = janitor
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slotrunner-janitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while True:
            try:
                self.janitor.sweep()
            except Exception as exc:  # a Redis blip or a damaged slot: try again later
                with contextlib.suppress(Exception):
                    error = f"{type(exc).__name__}: {exc}"
                    self.janitor.log.emit(job_events.JANITOR_ERROR, error=error)
            if self._stop.wait(self.interval_s):
                return
