"""The janitor: stale leases are reconciled under the slot lock, then recycled (I5, I7)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
import redis

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import SlotState, Stamp, iso, read_stamp, utc_now
from runner.slots.janitor import (
    JOB_FINISHED,
    LEASE_EXPIRED,
    OUTCOME_UNKNOWN,
    SUPERSEDED,
    Janitor,
    Owner,
    stale_reason,
)
from runner.slots.pool import NoSlotFree, ReleaseRefused, SlotPool
from tools import builtin
from tools.receipts.store import ReceiptStore, Status

NOW = utc_now()
ALIVE = Owner(current_attempt=1, live_attempt=1, finished=False)
SILENT = Owner(current_attempt=1, live_attempt=None, finished=False)


def stamp(state: SlotState = SlotState.LEASED, expires_in_s: float = 60, **extra: object) -> Stamp:
    fields: dict[str, object] = {
        "slot_id": "S0",
        "host": "h",
        "generation": 4,
        "job_id": "J",
        "attempt": 1,
        "state": state,
        "lease_expires_at": iso(NOW + timedelta(seconds=expires_in_s)),
    }
    fields.update(extra)
    return Stamp.model_validate(fields)


@pytest.mark.parametrize(
    ("slot", "owner", "expected"),
    [
        (stamp(SlotState.IDLE, job_id=None, attempt=None), None, None),
        (stamp(SlotState.POISONED), SILENT, None),
        (stamp(), ALIVE, None),
        (stamp(), SILENT, None),
        (stamp(expires_in_s=-1), ALIVE, None),  # a live attempt is never reclaimed on the clock
        (stamp(expires_in_s=-1), SILENT, LEASE_EXPIRED),
        (stamp(), Owner(current_attempt=2, live_attempt=2, finished=False), SUPERSEDED),
        (stamp(SlotState.CANCEL_REQUESTED), Owner(2, None, False), SUPERSEDED),
        (stamp(SlotState.OUTCOME_UNKNOWN), SILENT, OUTCOME_UNKNOWN),
        (stamp(SlotState.OUTCOME_UNKNOWN), ALIVE, None),
        (stamp(), Owner(current_attempt=1, live_attempt=None, finished=True), JOB_FINISHED),
        (stamp(), Owner(current_attempt=None, live_attempt=None, finished=False), None),
        (stamp(expires_in_s=-1), Owner(None, None, False), LEASE_EXPIRED),  # a CLI lease
    ],
)
def test_stale_reason_table(slot: Stamp, owner: Owner | None, expected: str | None) -> None:
    """Superseded or silent-and-expired leases are stale; live ones never are."""
    assert stale_reason(slot, NOW, owner) == expected


def setup(settings: Settings) -> tuple[redis.Redis, SlotPool, Janitor]:
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    log = EventLog(settings)
    pool = SlotPool(settings, client, log)
    return client, pool, Janitor(settings, client, log, pool)


def log_events(settings: Settings, name: str) -> list[dict[str, object]]:
    lines = settings.log_path.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_superseded_lease_is_reconciled_then_recycled(settings: Settings) -> None:
    """Open intents are resolved from the tree, then the slot is idle at a new generation."""
    client, pool, janitor = setup(settings)
    job = f"jan-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    lease = pool.lease(job, 1)
    slot_dir = settings.slots_dir / lease.slot_id
    store = ReceiptStore(slot_dir)
    done = "written by the dead attempt\n"
    (slot_dir / "work" / "done.txt").write_text(done)
    for name, content in (("done.txt", done), ("never.txt", "never written\n")):
        store.begin(
            key=f"{job}:a1:{name}",
            job_id=job,
            attempt=1,
            slot_id=lease.slot_id,
            generation=lease.generation,
            tool="write_file",
            relpath=name,
            digest=builtin.sha256(content.encode()),
        )
    client.incr(keys.job_attempt(job))  # attempt 2 fences attempt 1
    [reclaimed] = janitor.sweep()
    assert reclaimed.reason == SUPERSEDED and reclaimed.generation == lease.generation
    assert reclaimed.resolved == {
        f"{job}:a1:done.txt": "applied",
        f"{job}:a1:never.txt": "not_applied",
    }
    after = read_stamp(slot_dir)
    assert after is not None and after.state == SlotState.IDLE and after.job_id is None
    assert after.generation == lease.generation + 1 == reclaimed.new_generation
    assert client.get(keys.slot_generation(settings.host, lease.slot_id)) == str(after.generation)
    fresh = ReceiptStore(slot_dir)
    assert fresh.open_intents() == []
    never = fresh.lookup(f"{job}:a1:never.txt")
    assert never is not None and never.status == Status.FAILED
    [line] = log_events(settings, "slot_reclaimed")
    assert line["job_id"] == job and line["attempt"] == 1 and line["intents_applied"] == 1
    assert len(log_events(settings, "receipt_resolved")) == 2
    assert janitor.sweep() == []  # nothing left to do: a second sweep is a no-op
    assert pool.lease("other", 1).generation == after.generation + 1


def test_a_busy_slot_is_skipped_until_its_lock_is_free(settings: Settings) -> None:
    """While the tool server holds the slot lock (an apply), the janitor leaves the slot alone."""
    client, pool, janitor = setup(settings)
    job = f"jan-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    lease = pool.lease(job, 1)
    client.incr(keys.job_attempt(job))
    slot_dir = settings.slots_dir / lease.slot_id
    with slot_lock(slot_dir):
        assert janitor.sweep() == []
        assert read_stamp(slot_dir) == lease
    assert [r.slot_id for r in janitor.sweep()] == [lease.slot_id]


def test_a_live_attempt_keeps_an_expired_lease(settings: Settings) -> None:
    """An expired lease whose attempt still heartbeats is not reclaimed; a silent one is."""
    client, pool, janitor = setup(settings)
    job = f"jan-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    client.set(keys.job_heartbeat(job), 1, px=60_000)
    lease = pool.lease(job, 1, ttl_s=0.001)
    assert janitor.sweep() == []
    client.delete(keys.job_heartbeat(job))
    [reclaimed] = janitor.sweep()
    assert reclaimed.slot_id == lease.slot_id and reclaimed.reason == LEASE_EXPIRED
    # The old lease can neither renew nor release any more.
    lost = f"no longer leased to {job}@{lease.generation}"
    with pytest.raises(ReleaseRefused, match=lost):
        pool.renew(lease.slot_id, job, lease.generation, 60)
    with pytest.raises(ReleaseRefused, match=f"is not leased to {job} at generation"):
        pool.release(lease.slot_id, job, lease.generation)


def test_an_interrupted_reclaim_is_finished(settings: Settings) -> None:
    """A slot left outcome_unknown by a janitor that died is reclaimed by the next sweep."""
    client, pool, janitor = setup(settings)
    job = f"jan-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    lease = pool.lease(job, 1)
    pool.set_state(lease.slot_id, SlotState.OUTCOME_UNKNOWN, "reclaiming: superseded")
    [reclaimed] = janitor.sweep()
    assert reclaimed.reason == OUTCOME_UNKNOWN
    after = read_stamp(settings.slots_dir / lease.slot_id)
    assert after is not None and after.state == SlotState.IDLE


def test_cancel_requested_keeps_the_lease_until_release(settings: Settings) -> None:
    """cancel_requested still holds the slot (calls apply, capacity counted) until released."""
    client, pool, janitor = setup(settings.with_(slots=1))
    job = f"jan-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    client.set(keys.job_heartbeat(job), 1, px=60_000)
    lease = pool.lease(job, 1)
    marked = pool.request_cancel(lease.slot_id, job, lease.generation, "cancel requested")
    assert marked.state == SlotState.CANCEL_REQUESTED
    assert janitor.sweep() == []
    with pytest.raises(NoSlotFree, match="all 1 slots stayed busy"):
        pool.lease("someone-else", 1)
    pool.release(lease.slot_id, job, lease.generation)
    assert pool.lease("someone-else", 1).generation == lease.generation + 1
