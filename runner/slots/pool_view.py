"""Every host's slots in one view, for ``slotrunner slots list --pool``
(docs/architecture.md §Several hosts).

A slot's stamp on its own host's disk is the truth: leases, the fence and the janitor
read nothing else. This module keeps a copy of each stamp in the shared Redis
(``keys.slot_view``) so that any host can show the whole pool, and reads those copies
back with each host's beat (``runner/slots/host_beat.py``).

The copy is written under the slot's lock, right after the stamp, by every change of
it (``runner/slots/pool.py``, ``runner/slots/janitor.py``), so two changes of a slot
reach Redis in the order they happened. A copy that cannot be written is logged and
left: a view must never fail a lease the stamp already took, and the next host beat
writes every copy that differs from its stamp (which also covers a stamp changed by
the tool server, which has no Redis).
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Literal

import redis
from pydantic import BaseModel
from redis.typing import EncodableT, FieldT

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.stamp import Stamp, iso, valid_slot_id
from runner.jobs import events as job_events

# Compared with the stamp to decide whether a copy is stale; ``since`` is not: it is
# the moment the copy was first written for this state.
_COMPARED = ("generation", "job_id", "attempt", "state", "reason", "lease_expires_at")


def view_fields(stamp: Stamp, now: datetime) -> dict[str, str]:
    """The copy of ``stamp`` as Redis hash fields ("" for none). ``since`` is the
    lease's start for a lease, else ``now``: the age shown is the lease's, as in
    the local ``slots list``."""
    return {
        "generation": str(stamp.generation),
        "job_id": stamp.job_id or "",
        "attempt": "" if stamp.attempt is None else str(stamp.attempt),
        "state": stamp.state.value,
        "reason": stamp.reason or "",
        "lease_expires_at": stamp.lease_expires_at or "",
        "since": stamp.leased_at or iso(now),
    }


def differs(stamp: Stamp, copy: dict[str, str], now: datetime) -> bool:
    wanted = view_fields(stamp, now)
    return any(copy.get(name) != wanted[name] for name in _COMPARED)


def stage(pipe: redis.client.Pipeline, host: str, stamp: Stamp, now: datetime) -> None:
    """Queue the writes of one slot's copy on ``pipe`` (one round trip for all)."""
    pipe.hset(keys.slot_view(host, stamp.slot_id), mapping=_fields(view_fields(stamp, now)))
    pipe.sadd(keys.host_slots(host), stamp.slot_id)
    pipe.sadd(keys.HOSTS, host)


def _fields(fields: dict[str, str]) -> dict[FieldT, EncodableT]:
    return dict(fields.items())  # redis-py's own types (a dict's keys are invariant)


def publish(client: redis.Redis, host: str, stamp: Stamp, now: datetime, log: EventLog) -> bool:
    """Write one slot's copy; on a Redis error log ``slot_view_error`` and go on."""
    try:
        pipe = client.pipeline(transaction=False)
        stage(pipe, host, stamp, now)
        pipe.execute()
    except redis.RedisError as exc:
        with contextlib.suppress(Exception):
            error = f"{type(exc).__name__}: {exc}"
            log.emit(job_events.SLOT_VIEW_ERROR, slot_id=stamp.slot_id, error=error)
        return False
    return True


# -- reading the pool -------------------------------------------------------------------

HostStatus = Literal["live", "dead", "no_heartbeat"]


class SlotView(BaseModel):
    slot_id: str
    generation: int | None
    job_id: str | None
    attempt: int | None
    state: str
    reason: str | None
    since: str | None
    age_s: float | None
    lease_expires_at: str | None


class HostView(BaseModel):
    host: str
    # live: its alive key is there; dead: it beat once and its key expired;
    # no_heartbeat: never beat (slots leased by the CLI alone, say)
    status: HostStatus
    last_beat_at: str | None
    last_beat_age_s: float | None
    toolserver_url: str | None
    slots: list[SlotView]

    def heartbeat(self) -> str:
        """``live``, ``dead (last beat 42s ago)`` or ``no heartbeat``."""
        if self.status == "dead":
            ago = "?" if self.last_beat_age_s is None else f"{self.last_beat_age_s:.0f}s"
            return f"dead (last beat {ago} ago)"
        return "live" if self.status == "live" else "no heartbeat"


def read_pool(client: redis.Redis, now: datetime) -> list[HostView]:
    """Every host's beat and slots, from Redis alone (three round trips)."""
    hosts = sorted(str(h) for h in client.smembers(keys.HOSTS))
    pipe = client.pipeline(transaction=False)
    for host in hosts:
        pipe.hgetall(keys.host_beat(host))
        pipe.exists(keys.host_alive(host))
        pipe.smembers(keys.host_slots(host))
    answers = pipe.execute()
    beats: list[dict[str, str]] = answers[0::3]
    alive: list[int] = answers[1::3]
    slot_ids = [
        sorted((str(s) for s in ids if valid_slot_id(str(s))), key=_slot_order)
        for ids in answers[2::3]
    ]
    pipe = client.pipeline(transaction=False)
    for host, ids in zip(hosts, slot_ids, strict=True):
        for slot_id in ids:
            pipe.hgetall(keys.slot_view(host, slot_id))
    copies = iter(pipe.execute())
    views = []
    for host, beat, up, ids in zip(hosts, beats, alive, slot_ids, strict=True):
        slots = [_slot(slot_id, next(copies), now) for slot_id in ids]
        status: HostStatus = "live" if up else ("dead" if beat else "no_heartbeat")
        beat_at = beat.get("beat_at") or None
        views.append(
            HostView(
                host=host,
                status=status,
                last_beat_at=beat_at,
                last_beat_age_s=_age(beat_at, now),
                toolserver_url=beat.get("toolserver_url") or None,
                slots=slots,
            )
        )
    return views


def _slot(slot_id: str, copy: dict[str, str], now: datetime) -> SlotView:
    since = copy.get("since") or None
    return SlotView(
        slot_id=slot_id,
        generation=_int(copy.get("generation")),
        job_id=copy.get("job_id") or None,
        attempt=_int(copy.get("attempt")),
        state=copy.get("state") or "unknown",
        reason=copy.get("reason") or None,
        since=since,
        age_s=_age(since, now),
        lease_expires_at=copy.get("lease_expires_at") or None,
    )


def _slot_order(slot_id: str) -> tuple[int, str]:
    return len(slot_id), slot_id  # S2 before S10


def _int(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _age(moment: str | None, now: datetime) -> float | None:
    """Seconds since ``moment`` by the reader's clock (a writer's skew shows here only)."""
    if not moment:
        return None
    try:
        return max(0.0, (now - datetime.fromisoformat(moment)).total_seconds())
    except ValueError:
        return None
