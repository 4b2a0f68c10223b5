"""The admission desk: a bounded, generation-counted lease per inference request.

One desk per eval-run, in Redis, shared by every worker of the run
(docs/architecture.md §Admission, I6, I7). A worker acquires a lease before it sends
an inference request; at most ``bound`` leases are held at once, and work that cannot
be held is refused and counted. A completion is applied to the planner only through
:meth:`apply`, which commits it iff its lease is still live and no other completion
holds its step. A local timeout calls :meth:`expire`, which fences the late body
without returning the capacity: the request may still be running in the backend.
Capacity comes back only on :meth:`release`, exactly once per lease. The lease state machine is
``runner/admission/table.py``; the scripts that apply it, ``runner/admission/lua.py``;
the lease, the desk's Redis keys and its errors, ``runner/admission/lease.py``.

Redis restarted empty (or the desk's keys lost): the next call re-creates the desk
with a new random ``epoch``, and ``in_flight`` is rebuilt from the lease records
that survive (none after a full loss), never carried over or guessed. Every lease
carries the epoch it was granted in, so a lease from the lost incarnation is
*foreign*: its completion is stale (its commit record is gone, so nothing could
prove it is the only one), its release never decrements (it was never counted in
this epoch, so ``in_flight`` cannot go negative), and its expire or cancel *adopts*
it, counting it again until its release, because its request is still out.

Requests of the lost epoch may still be running, and until their holders call
again nothing counts them, so the desk fails closed: it grants nothing during a
*recovery hold* of ``recovery_hold_s`` after it was re-created (``recovering_until_ms``,
server clock; ``recoveries`` counts the losses seen), long enough for every such
request to end. Callers that may wait keep waiting, up to their deadline; callers
that may not are refused ``recovering``. Expire and cancel still adopt, apply is
still stale, release still never decrements; after the hold, capacity is the bound
less the adopted leases. A call brings the hold when its caller has *evidence* that
a desk existed before: an epoch it saw that is not the current one, remembered by
the :class:`AdmissionDesk` object and, given ``home``, by the host's witness file
(``runner/admission/witness.py``), which a fresh process after the wipe reads. A
caller without evidence (first use of the eval-run) creates the desk without a hold.
Evidence that arrives after a caller without any re-created the desk starts the hold
then, from the desk's creation; leases granted before it stay granted. That is the
limit left: the witness is per host, so a host that never used the eval-run, calling
first after a loss, can be granted leases until any caller with evidence calls. A
lease whose epoch the host cannot witness (the file cannot be made durable) is given
back at once and refused ``no_witness``: a fresh process after a wipe would not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from redis.commands.core import AsyncScript

from runner.admission.lease import (
    AdmissionRefused,
    DeskKeys,
    DeskMismatch,
    Lease,
    RefusalReason,
    StaleCompletion,
)
from runner.admission.lua import ACQUIRE_LUA, GIVE_UP_LUA, TRANSITION_LUA
from runner.admission.table import TRANSITIONS, LeaseState, Op, Result
from runner.admission.witness import EpochMemory, EpochWitness

DEFAULT_MAX_WAITING = 64
DEFAULT_POLL_S = 0.05
# A waiter's queue entry outlives its own deadline by this much before another
# caller may drop it as abandoned (its process died while waiting).
WAITER_GRACE_S = 5.0
# How long a re-created desk grants nothing when the caller does not say: the chat
# planner's HTTP timeout at its default request timeout (20 x 60 s, runner/agent/planners.py)
# and a minute. Callers that know how long their requests can run pass their own.
DEFAULT_RECOVERY_HOLD_S = 1260.0

_EVAL_RUN = re.compile(r"[^\s{}]{1,200}")

# The desk's counts: the fixed fields, then every counter the transition table names.
_STAT_FIELDS = (
    *("bound", "in_flight", "generation", "acquired", "refused"),
    *("duplicate_completion", "underflow_prevented", "recoveries"),
    *sorted({tr.counter for tr in TRANSITIONS.values() if tr.counter}),
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class AdmissionDesk:
    """The admission desk of one eval-run (see the module docstring).

    ``home`` (``$SLOTRUNNER_HOME``) enables the host's witness file; without it only
    this object remembers the epochs it saw. ``recovery_hold_s`` should be the longest
    a request of this caller can stay in the backend after it was sent.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        eval_run: str,
        bound: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        max_waiting: int = DEFAULT_MAX_WAITING,
        poll_s: float = DEFAULT_POLL_S,
        home: Path | None = None,
        recovery_hold_s: float = DEFAULT_RECOVERY_HOLD_S,
        aio_client: redis.asyncio.Redis | None = None,
    ) -> None:
        if not isinstance(eval_run, str) or not _EVAL_RUN.fullmatch(eval_run):
            problem = "must be 1-200 characters without whitespace or braces"
            raise ValueError(f"eval_run {problem}, got {eval_run!r}")
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise ValueError(f"bound must be an integer >= 1, got {bound!r}")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an integer >= 0, got {max_waiting!r}")
        if not (math.isfinite(poll_s) and poll_s > 0):
            raise ValueError(f"poll_s must be a positive number, got {poll_s!r}")
        if not (math.isfinite(recovery_hold_s) and recovery_hold_s >= 0):
            raise ValueError(f"recovery_hold_s must be a number >= 0, got {recovery_hold_s!r}")
        self.eval_run = eval_run
        self.bound = bound
        self.max_waiting = max_waiting
        self.recovery_hold_s = recovery_hold_s
        self.keys = DeskKeys.of(eval_run)
        self.witness = EpochWitness(home, eval_run) if home is not None else None
        self._redis = redis_client
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self._hold_ms = math.ceil(recovery_hold_s * 1000)
        self._epochs = EpochMemory(self.witness)
        self._acquire_script = redis_client.register_script(ACQUIRE_LUA)
        self._give_up_script = redis_client.register_script(GIVE_UP_LUA)
        self._transition_script = redis_client.register_script(TRANSITION_LUA)
        # The same scripts on the same server for callers on an event loop (the gateway).
        self._aio_acquire_script: AsyncScript | None = None
        self._aio_give_up_script: AsyncScript | None = None
        self._aio_transition_script: AsyncScript | None = None
        if aio_client is not None:
            self._aio_acquire_script = aio_client.register_script(ACQUIRE_LUA)
            self._aio_give_up_script = aio_client.register_script(GIVE_UP_LUA)
            self._aio_transition_script = aio_client.register_script(TRANSITION_LUA)

    def acquire(self, step: int, deadline_s: float) -> Lease:
        """Hold capacity for one request of planner ``step``, waiting up to ``deadline_s``.

        Raises :class:`AdmissionRefused` (counted as ``refused``) when the bound is
        reached or the desk is in its recovery hold and the caller may not wait
        (``deadline_s == 0``), when ``max_waiting`` callers already wait in the run's
        shared queue (the limit is this caller's; the queue is everyone's), when the
        deadline passes, or when the host's witness file cannot record the epoch of
        the lease (``no_witness``: the lease is released at once).
        """
        lease_id, wait_ttl_ms, end_s = self._start_acquire(step, deadline_s)
        waiter = ""
        try:
            while True:
                keys, args = self._acquire_call(lease_id, step, waiter, wait_ttl_ms)
                try:
                    lease, waiter, witnessed = self._acquired(
                        self._acquire_script(keys=keys, args=args), lease_id, step
                    )
                except AdmissionRefused:
                    waiter = ""  # a refusal leaves no queue entry behind
                    raise
                if lease is not None:
                    if not witnessed:
                        self._refuse_unwitnessed(lease)
                    return lease
                remaining_s = end_s - self._clock()
                if remaining_s <= 0:
                    self._give_up(waiter)
                    waiter = ""
                    raise AdmissionRefused(RefusalReason.DEADLINE, self.eval_run)
                self._sleep(min(self._poll_s, remaining_s))
        except BaseException:
            if waiter:  # interrupted while queued: leave the queue, count the refusal
                # If Redis is unreachable, the entry expires on its own after its deadline.
                with contextlib.suppress(redis.RedisError):
                    self._give_up(waiter)
            raise

    async def acquire_async(self, step: int, deadline_s: float) -> Lease:
        """:meth:`acquire` on the desk's ``aio_client``, from the caller's event loop: a
        desk with room grants in one script call and no thread; a queued caller polls
        every ``poll_s`` with ``asyncio.sleep``. Raises as :meth:`acquire` does."""
        if self._aio_acquire_script is None or self._aio_give_up_script is None:
            raise RuntimeError("this desk was made without an aio_client")
        lease_id, wait_ttl_ms, end_s = self._start_acquire(step, deadline_s)
        waiter = ""
        try:
            while True:
                keys, args = self._acquire_call(lease_id, step, waiter, wait_ttl_ms)
                try:
                    reply = await self._aio_acquire_script(keys=keys, args=args)
                    lease, waiter, witnessed = self._acquired(reply, lease_id, step)
                except AdmissionRefused:
                    waiter = ""
                    raise
                if lease is not None:
                    if not witnessed:  # rare (a witness file that cannot be written)
                        await asyncio.to_thread(self._refuse_unwitnessed, lease)
                    return lease
                remaining_s = end_s - self._clock()
                if remaining_s <= 0:
                    await self._give_up_async(waiter)
                    waiter = ""
                    raise AdmissionRefused(RefusalReason.DEADLINE, self.eval_run)
                await asyncio.sleep(min(self._poll_s, remaining_s))
        except BaseException:
            if waiter:
                with contextlib.suppress(redis.RedisError):
                    await self._give_up_async(waiter)
            raise

    def _start_acquire(self, step: int, deadline_s: float) -> tuple[str, int, float]:
        """A checked acquire's lease id, its queue entry's TTL (ms) and its end (clock)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        if not (math.isfinite(deadline_s) and deadline_s >= 0):
            raise ValueError(f"deadline_s must be a finite number >= 0, got {deadline_s!r}")
        wait_ttl_ms = math.ceil((deadline_s + WAITER_GRACE_S) * 1000) if deadline_s > 0 else 0
        return uuid.uuid4().hex, wait_ttl_ms, self._clock() + deadline_s

    def _acquire_call(
        self, lease_id: str, step: int, waiter: str, wait_ttl_ms: int
    ) -> tuple[list[str], list[Any]]:
        keys = [self.keys.desk, self.keys.leases, self.keys.waiting]
        args = [*self._desk_args(), lease_id, step, waiter, self.max_waiting, wait_ttl_ms]
        return keys, args

    def _acquired(self, raw: Any, lease_id: str, step: int) -> tuple[Lease | None, str, bool]:
        """One acquire reply: (the lease, "", witnessed) when granted, (None, the queue
        entry, witnessed) when queued; raises when refused or the bound differs."""
        reply = [_text(v) for v in raw]
        witnessed = self._epochs.saw(reply[-1])
        if reply[0] == "granted":
            return Lease(lease_id, int(reply[1]), step, reply[2]), "", witnessed
        if reply[0] == "mismatch":
            raise DeskMismatch(
                f"eval-run {self.eval_run!r} has an admission desk with bound "
                f"{reply[1]}, this worker was configured with {self.bound}"
            )
        if reply[0] == "refused":
            raise AdmissionRefused(RefusalReason(reply[1]), self.eval_run)
        return None, reply[1], witnessed

    def expire(self, lease: Lease) -> bool:
        """The local timeout fired: fence the late completion, keep the capacity counted."""
        return self._transition(Op.EXPIRE, lease)[0] == Result.CHANGED

    def cancel(self, lease: Lease) -> bool:
        """The answer is no longer wanted; capacity stays counted until :meth:`release`."""
        return self._transition(Op.CANCEL, lease)[0] == Result.CHANGED

    def apply(self, lease: Lease) -> bool:
        """True when this completion commits its step; False when the step was committed.

        Raises :class:`StaleCompletion` (counted as ``stale_completion``) when the
        lease is not live: expired, cancelled, released, unknown or of a lost epoch.
        """
        return self._applied([self._transition(Op.APPLY, lease)], lease)

    def release(self, lease: Lease) -> bool:
        """Return the lease's capacity: True once per lease, False (counted) after that."""
        return self._transition(Op.RELEASE, lease)[0] == Result.CHANGED

    def apply_and_release(self, lease: Lease) -> bool:
        """:meth:`apply`, then :meth:`release` whatever the apply said, in one script call
        (one round trip, atomically). Returns and raises as :meth:`apply` does; the
        capacity is back either way."""
        return self._applied(self._transitions((Op.APPLY, Op.RELEASE), lease), lease)

    async def apply_and_release_async(self, lease: Lease) -> bool:
        """:meth:`apply_and_release` on the desk's ``aio_client``, without a thread. A new
        epoch seen is recorded in the witness file from the calling thread (it happens
        once per epoch)."""
        if self._aio_transition_script is None:
            raise RuntimeError("this desk was made without an aio_client")
        ops = (Op.APPLY, Op.RELEASE)
        keys, args = self._call(ops, lease)
        reply = await self._aio_transition_script(keys=keys, args=args)
        return self._applied(self._outcomes(ops, reply), lease)

    def committed_lease(self, step: int) -> str | None:
        """The lease id whose completion committed ``step``, if any."""
        value = self._redis.hget(self.keys.committed, str(step))
        return None if value is None else _text(value)

    def epoch(self) -> str | None:
        """The desk's current epoch (None before first use)."""
        value = self._redis.hget(self.keys.desk, "epoch")
        return None if value is None else _text(value)

    def stats(self) -> dict[str, int]:
        """The desk's counts, read in one transaction (zeros before first use);
        ``recovery_hold_left_ms`` is what is left of a recovery hold (server clock)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hgetall(self.keys.desk)
        pipe.zcard(self.keys.waiting)
        pipe.hlen(self.keys.committed)
        pipe.time()
        desk, waiting, committed, (now_s, now_us) = pipe.execute()
        fields = {_text(k): _text(v) for k, v in desk.items()}
        stats = {name: int(fields.get(name, 0)) for name in _STAT_FIELDS}
        stats["bound"] = int(fields.get("bound", self.bound))
        stats["waiting"] = int(waiting)
        stats["committed"] = int(committed)
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        hold_until_ms = int(fields.get("recovering_until_ms", 0))
        stats["recovery_hold_left_ms"] = max(0, hold_until_ms - now_ms)
        return stats

    def _desk_args(self) -> list[str | int]:
        """bound, new_epoch, seen_epoch, hold_ms: what every script takes first."""
        return [self.bound, uuid.uuid4().hex, self._epochs.evidence(), self._hold_ms]

    def _refuse_unwitnessed(self, lease: Lease) -> None:
        """A lease this host could not witness: after a Redis loss a fresh process here
        would not know the desk existed, so the lease is not used."""
        self.release(lease)
        self._give_up("")
        raise AdmissionRefused(RefusalReason.NO_WITNESS, self.eval_run)

    def _give_up(self, waiter: str) -> None:
        epoch = self._give_up_script(
            keys=[self.keys.desk, self.keys.leases, self.keys.waiting],
            args=[*self._desk_args(), waiter],
        )
        self._epochs.saw(_text(epoch))

    async def _give_up_async(self, waiter: str) -> None:
        assert self._aio_give_up_script is not None  # acquire_async checked it
        epoch = await self._aio_give_up_script(
            keys=[self.keys.desk, self.keys.leases, self.keys.waiting],
            args=[*self._desk_args(), waiter],
        )
        self._epochs.saw(_text(epoch))

    def _transition(self, op: Op, lease: Lease) -> tuple[Result, LeaseState]:
        return self._transitions((op,), lease)[0]

    def _transitions(self, ops: tuple[Op, ...], lease: Lease) -> list[tuple[Result, LeaseState]]:
        keys, args = self._call(ops, lease)
        return self._outcomes(ops, self._transition_script(keys=keys, args=args))

    def _call(self, ops: tuple[Op, ...], lease: Lease) -> tuple[list[str], list[Any]]:
        """The transition script's keys and args: ``ops`` applied to ``lease`` in order."""
        if not isinstance(lease, Lease):
            raise TypeError(f"expected a Lease, got {type(lease).__name__}")
        keys = [self.keys.desk, self.keys.leases, self.keys.committed]
        args = [
            *self._desk_args(),
            ",".join(op.value for op in ops),
            lease.lease_id,
            str(lease.generation),
            str(lease.step),
            lease.epoch,
        ]
        return keys, args

    def _outcomes(self, ops: tuple[Op, ...], reply: Any) -> list[tuple[Result, LeaseState]]:
        """Each op's result and the state it found the lease in; the epoch remembered."""
        self._epochs.saw(_text(reply[-1]))
        return [
            (Result(_text(reply[i])), LeaseState(_text(reply[i + 1])))
            for i in range(0, 2 * len(ops), 2)
        ]

    @staticmethod
    def _applied(outcomes: list[tuple[Result, LeaseState]], lease: Lease) -> bool:
        """An apply's outcome (the first): committed, a duplicate (False), or stale."""
        result, state = outcomes[0]
        if result == Result.STALE:
            raise StaleCompletion(state, lease)
        return result == Result.COMMIT
