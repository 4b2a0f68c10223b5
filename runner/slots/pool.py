"""A host's pool of workspace slots, each leased to one job attempt at a time.

Every lease stamps the slot with a new **generation**: max(local stamp, Redis
mirror) + 1, written durably to the local stamp first (the high-water mark that
survives a Redis that lost its data) and then to the mirror (which survives a lost
local disk). A generation therefore only grows (I5), and every tool call names the
generation it was issued under, so a call from an earlier lease is refused (I1).

All changes to a slot happen under its ``.lock`` filelock, the same lock the tool
server holds while it checks an envelope and applies a call, so a slot can never be
recycled between a call's check and its effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import redis
from filelock import Timeout
from pydantic import Field

from runner.core import events, keys
from runner.core.logs import EventLog
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import SlotState, Stamp, iso, read_stamp, utc_now, valid_slot_id, write_stamp
from runner.errors import RunnerError
from runner.slots import pool_view
from runner.slots.rotation import rotate_receipts
from tools import tokens

# Raise the Redis mirror only when the new value is larger: a stale writer can never
# move a slot's generation backwards.
_RAISE_TO = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('SET', KEYS[1], wanted)
  return wanted
end
return current
"""


class SlotError(RunnerError):
    """Base of the slot errors."""


class NoSlotFree(SlotError):
    """Every slot stayed busy for the whole wait."""


class ReleaseRefused(SlotError):
    """A release that does not match the slot's current lease (a second release, say)."""


class UnknownSlot(SlotError):
    """No slot of that id on this host."""


class SlotBusy(SlotError):
    """The slot's lock stayed held for longer than the caller would wait."""


class Lease(Stamp):
    """The stamp of a new lease, with the lease's token and the MCP URL to use it at
    (``docs/architecture.md`` §Lease tokens).

    Both are left out of every dump: writing this object as a stamp, or logging it,
    never puts the token on disk or in a log. Only the lease's taker has it.
    """

    token: str = Field(default="", exclude=True, repr=False)
    mcp_url: str = Field(default="", exclude=True)

    # A lease is its stamp: equal to the stamp read back from the slot (Python asks
    # the subclass first, whichever side it is on).
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stamp):
            return self.model_dump() == other.model_dump()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.model_dump().items()))


class SlotPool:
    def __init__(
        self,
        settings: Settings,
        redis_client: redis.Redis,
        log: EventLog,
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.redis = redis_client
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self._raise_to = redis_client.register_script(_RAISE_TO)

    # -- layout ---------------------------------------------------------------

    def slot_ids(self) -> list[str]:
        return [f"S{i}" for i in range(self.settings.slots)]

    def slot_dir(self, slot_id: str) -> Path:
        if not valid_slot_id(slot_id):
            raise UnknownSlot(f"{slot_id!r} is not a slot id")
        path = self.settings.slots_dir / slot_id
        if not path.is_dir():
            raise UnknownSlot(f"no slot {slot_id} under {self.settings.slots_dir}")
        return path

    def ensure_layout(self) -> None:
        for slot_id in self.slot_ids():
            path = self.settings.slots_dir / slot_id
            (path / "work").mkdir(parents=True, exist_ok=True)
            if read_stamp(path) is not None:
                # Stamped already: no lock needed, and none taken, because the tool
                # server holds it for a whole run_tests and a lease must not wait on it.
                continue
            with slot_lock(path):
                if read_stamp(path) is None:
                    generation = self._mirror(slot_id)
                    first = Stamp(slot_id=slot_id, host=self.settings.host, generation=generation)
                    write_stamp(path, first)
                    self.publish_view(first)

    def list(self) -> list[Stamp]:
        stamps = []
        for slot_id in self.slot_ids():
            stamp = read_stamp(self.settings.slots_dir / slot_id)
            if stamp is not None:
                stamps.append(stamp)
        return stamps

    # -- lease ----------------------------------------------------------------

    def _mirror(self, slot_id: str) -> int:
        value = self.redis.get(keys.slot_generation(self.settings.host, slot_id))
        return int(value) if value is not None else 0

    def next_generation(self, slot_id: str, current: Stamp | None) -> int:
        """max(local stamp, Redis mirror) + 1; the caller holds the slot lock (I5)."""
        local = current.generation if current is not None else 0
        return max(local, self._mirror(slot_id)) + 1

    def publish_generation(self, slot_id: str, generation: int) -> None:
        """Raise the Redis mirror after the local stamp is durable (never lowers it)."""
        self._raise_to(keys=[keys.slot_generation(self.settings.host, slot_id)], args=[generation])

    def publish_view(self, stamp: Stamp) -> None:
        """Copy the new stamp for ``slots list --pool``; the caller holds the slot lock.
        Never raises: the stamp is the truth and a failed copy is healed by the host
        beat (``runner/slots/pool_view.py``)."""
        pool_view.publish(self.redis, self.settings.host, stamp, self.clock(), self.log)

    def lease(
        self,
        job_id: str,
        attempt: int,
        *,
        ttl_s: float | None = None,
        wait_s: float = 0.0,
        poll_s: float = 0.1,
        on_wait: Callable[[], None] | None = None,
        tools: Iterable[str] | None = None,
    ) -> Lease:
        """Lease a free slot to ``job_id``/``attempt``; wait up to ``wait_s`` for one.

        ``on_wait`` runs before each retry while waiting (the job runs the janitor and
        checks for a cancel there); an exception from it ends the wait. ``tools``
        narrows what the lease may call (None: every tool); it is bound to the token.
        """
        self.ensure_layout()
        tries = 0
        allowed = None if tools is None else tuple(tools)

        def free_slot() -> Lease | None:
            nonlocal tries
            tries += 1
            if tries > 1 and on_wait is not None:
                on_wait()  # between tries, after the sleep
            for slot_id in self.slot_ids():
                stamp = self._try_lease(slot_id, job_id, attempt, ttl_s, allowed)
                if stamp is not None:
                    return stamp
            return None

        try:
            return poll_until(free_slot, wait_s, poll_s, sleep=self.sleep)
        except PollTimeout:
            raise NoSlotFree(
                f"all {self.settings.slots} slots stayed busy for {wait_s:.1f}s"
            ) from None

    def _try_lease(
        self,
        slot_id: str,
        job_id: str,
        attempt: int,
        ttl_s: float | None,
        tools: tuple[str, ...] | None,
    ) -> Lease | None:
        path = self.settings.slots_dir / slot_id
        try:
            with slot_lock(path, timeout_s=0):
                current = read_stamp(path)
                if current is not None and current.state != SlotState.IDLE:
                    return None
                generation = self.next_generation(slot_id, current)
                rotate_receipts(path, generation, self.log)
                now = self.clock()
                ttl = self.settings.lease_ttl_s if ttl_s is None else ttl_s
                stamp = Stamp(
                    slot_id=slot_id,
                    host=self.settings.host,
                    generation=generation,
                    job_id=job_id,
                    attempt=attempt,
                    state=SlotState.LEASED,
                    leased_at=iso(now),
                    lease_expires_at=iso(now + timedelta(seconds=ttl)),
                )
                # The token's record before the stamp: a lease never exists without it.
                token = tokens.issue(
                    path,
                    host=self.settings.host,
                    slot_id=slot_id,
                    generation=generation,
                    job_id=job_id,
                    attempt=attempt,
                    tools=tools,
                )
                # Local first: if Redis then loses the write, the stamp still holds the
                # high-water mark and the next lease counts from it.
                write_stamp(path, stamp)
                self.publish_generation(slot_id, generation)
                self.publish_view(stamp)
        except Timeout:
            return None  # someone holds the lock: the slot is busy
        self.log.emit(
            events.SLOT_LEASED,
            slot_id=slot_id,
            generation=generation,
            job_id=job_id,
            attempt=attempt,
        )
        url = tokens.mcp_url(self.settings.toolserver_url)
        return Lease(**stamp.model_dump(), token=token, mcp_url=url)

    def renew(
        self,
        slot_id: str,
        job_id: str,
        generation: int,
        ttl_s: float,
        *,
        lock_timeout_s: float = -1,
    ) -> Stamp:
        """Push the lease's expiry forward; refused when the lease is no longer this one.

        With ``lock_timeout_s`` >= 0 a slot whose lock stays held that long raises
        :class:`SlotBusy` (the tool server holds it for a whole apply; the heartbeat
        thread must not stall behind a long ``run_tests``).
        """
        path = self.slot_dir(slot_id)
        try:
            with slot_lock(path, timeout_s=lock_timeout_s):
                return self._renew_locked(path, slot_id, job_id, generation, ttl_s)
        except Timeout:
            raise SlotBusy(f"slot {slot_id} is locked (a call is being applied)") from None

    def _renew_locked(
        self, path: Path, slot_id: str, job_id: str, generation: int, ttl_s: float
    ) -> Stamp:
        current = read_stamp(path)
        if (
            current is None
            or current.job_id != job_id
            or current.generation != generation
            or not current.holds_lease()
        ):
            raise ReleaseRefused(f"slot {slot_id} is no longer leased to {job_id}@{generation}")
        stamp = current.model_copy(
            update={"lease_expires_at": iso(self.clock() + timedelta(seconds=ttl_s))}
        )
        write_stamp(path, stamp)
        self.publish_view(stamp)
        return stamp

    # -- release --------------------------------------------------------------

    def release(self, slot_id: str, job_id: str, generation: int) -> Stamp:
        """Return the slot to the pool, exactly once per lease."""
        path = self.slot_dir(slot_id)
        with slot_lock(path):
            current = read_stamp(path)
            ok = (
                current is not None
                and current.job_id == job_id
                and current.generation == generation
                and current.lease_open()
            )
            if not ok:
                have = (
                    "no stamp"
                    if current is None
                    else f"{current.state} {current.job_id}@{current.generation}"
                )
                self.log.emit(
                    events.SLOT_RELEASE_REFUSED,
                    slot_id=slot_id,
                    generation=generation,
                    job_id=job_id,
                    holder=have,
                )
                raise ReleaseRefused(
                    f"slot {slot_id} is not leased to {job_id} at generation {generation} ({have})"
                )
            assert current is not None
            stamp = current.model_copy(
                update={
                    "state": SlotState.IDLE,
                    "job_id": None,
                    "attempt": None,
                    "leased_at": None,
                    "lease_expires_at": None,
                    "reason": None,
                }
            )
            write_stamp(path, stamp)
            self.publish_view(stamp)
        self.log.emit(
            events.SLOT_RELEASED,
            slot_id=slot_id,
            generation=generation,
            job_id=job_id,
            attempt=current.attempt,
        )
        return stamp

    def request_cancel(self, slot_id: str, job_id: str, generation: int, reason: str) -> Stamp:
        """Mark this lease ``cancel_requested``: still held (capacity stays counted, its
        calls still apply) until the job confirms the release."""
        path = self.slot_dir(slot_id)
        with slot_lock(path):
            current = read_stamp(path)
            if (
                current is None
                or current.job_id != job_id
                or current.generation != generation
                or not current.holds_lease()
            ):
                raise ReleaseRefused(f"slot {slot_id} is no longer leased to {job_id}@{generation}")
            stamp = current.model_copy(
                update={"state": SlotState.CANCEL_REQUESTED, "reason": reason}
            )
            write_stamp(path, stamp)
            self.publish_view(stamp)
        return stamp

    def set_state(self, slot_id: str, state: SlotState, reason: str) -> Stamp:
        """Mark a slot (poisoned, outcome_unknown, cancel_requested) and say why."""
        path = self.slot_dir(slot_id)
        with slot_lock(path):
            stamp = mark(path, state, reason)
            self.publish_view(stamp)
            return stamp

    @contextmanager
    def locked(self, slot_id: str) -> Iterator[Path]:
        path = self.slot_dir(slot_id)
        with slot_lock(path):
            yield path


def mark(slot_dir: Path, state: SlotState, reason: str) -> Stamp:
    """Change a slot's state; the caller holds the slot lock."""
    current = read_stamp(slot_dir)
    if current is None:
        raise UnknownSlot(f"{slot_dir} has no stamp")
    stamp = current.model_copy(update={"state": state, "reason": reason})
    write_stamp(slot_dir, stamp)
    return stamp
