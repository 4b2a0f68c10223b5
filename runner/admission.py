"""The admission desk: a bounded, generation-counted lease per inference request.

One desk per eval-run, in Redis, shared by every worker of the run (DESIGN §6, I6,
I7). A worker acquires a lease before it sends an inference request; at most
``bound`` leases are held at once, and work that cannot be held is refused and
counted. A completion is applied to the planner only through :meth:`apply`, which
commits it iff its lease is still live and no other completion holds its step. A
local timeout calls :meth:`expire`, which fences the late body without returning
the capacity: the request may still be running in the backend. Capacity comes
back only on :meth:`release`, exactly once per lease.

Redis keys (``E`` is the eval-run; the ``{E}`` hash tag keeps one desk in one
cluster slot, so every script touches a single slot):

    admission:{E}:desk       HASH  bound, epoch, in_flight, generation, ticket, and
                                   the counters acquired, refused, expired,
                                   cancelled, released, stale_completion,
                                   duplicate_completion, double_release,
                                   stale_release, adopted, underflow_prevented
    admission:{E}:leases     HASH  lease id -> JSON {state, generation, step, epoch};
                                   released leases stay, so a second release is
                                   recognised as one
    admission:{E}:committed  HASH  step -> lease id of the one completion committed
    admission:{E}:waiting    ZSET  "<expiry_ms>:<lease id>" scored by arrival ticket:
                                   the bounded FIFO of callers waiting for capacity

Redis restarted empty (or the desk's keys lost): the next call re-creates the desk
with a new random ``epoch``, and ``in_flight`` is rebuilt from the lease records
that survive (none after a full loss), never carried over or guessed. Every lease
carries the epoch it was granted in, so a lease from the lost incarnation is
*foreign*: its completion is stale (its commit record is gone, so nothing could
prove it is the only one), its release never decrements (it was never counted in
this epoch, so ``in_flight`` cannot go negative), and its expire or cancel *adopts*
it, counting it again until its release, because its request is still out. The
residual gap: until a holder of a lost lease next calls the desk, new leases can
be granted next to requests still running in the backend; their completions are
all rejected, so no step commits twice, but the backend may briefly see more than
``bound`` requests. Only a Redis that fsyncs every write closes that gap.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import redis

DEFAULT_MAX_WAITING = 64
DEFAULT_POLL_S = 0.05
# A waiter's queue entry outlives its own deadline by this much before another
# caller may drop it as abandoned (its process died while waiting).
WAITER_GRACE_S = 5.0

_EVAL_RUN = re.compile(r"[^\s{}]{1,200}")


class LeaseState(StrEnum):
    LIVE = "live"
    EXPIRED = "expired"  # timed out locally; the request may still be running
    CANCEL_REQUESTED = "cancel_requested"  # unwanted, but not yet confirmed stopped
    RELEASED = "released"  # capacity returned; the record stays for audit
    UNKNOWN = "unknown"  # no such lease in this epoch (or not the one on record)
    FOREIGN = "foreign"  # granted by an epoch this desk no longer has


class Op(StrEnum):
    EXPIRE = "expire"
    CANCEL = "cancel"
    APPLY = "apply"
    RELEASE = "release"


class Result(StrEnum):
    CHANGED = "changed"
    NOOP = "noop"
    COMMIT = "commit"  # in the table: commit unless the step is taken
    DUPLICATE = "duplicate"  # the step was taken: this completion is dropped
    STALE = "stale"
    DOUBLE_RELEASE = "double_release"
    UNKNOWN = "unknown"


class RefusalReason(StrEnum):
    BOUND = "bound"  # at the bound and the caller may not wait
    QUEUE_FULL = "queue_full"  # at the bound and max_waiting callers already wait
    DEADLINE = "deadline"  # waited until the deadline without getting capacity


@dataclass(frozen=True)
class Transition:
    to: LeaseState | None  # None: the lease record is left as it is
    result: Result
    in_flight: int = 0  # change to in_flight
    bump_generation: bool = False
    counter: str = ""  # desk counter to increment


_S, _O, _R = LeaseState, Op, Result
_NOOP = Transition(None, _R.NOOP)
_STALE = Transition(None, _R.STALE, counter="stale_completion")
_RELEASE = Transition(_S.RELEASED, _R.CHANGED, in_flight=-1, counter="released")
_UNKNOWN = Transition(None, _R.UNKNOWN)

# The lease state machine: the Lua script below only interprets this table.
TRANSITIONS: Mapping[tuple[LeaseState, Op], Transition] = MappingProxyType(
    {
        (_S.LIVE, _O.EXPIRE): Transition(
            _S.EXPIRED, _R.CHANGED, bump_generation=True, counter="expired"
        ),
        (_S.LIVE, _O.CANCEL): Transition(_S.CANCEL_REQUESTED, _R.CHANGED, counter="cancelled"),
        (_S.LIVE, _O.APPLY): Transition(None, _R.COMMIT),
        (_S.LIVE, _O.RELEASE): _RELEASE,
        (_S.EXPIRED, _O.EXPIRE): _NOOP,
        (_S.EXPIRED, _O.CANCEL): _NOOP,  # already fenced; cancelling adds nothing
        (_S.EXPIRED, _O.APPLY): _STALE,
        (_S.EXPIRED, _O.RELEASE): _RELEASE,
        (_S.CANCEL_REQUESTED, _O.EXPIRE): _NOOP,
        (_S.CANCEL_REQUESTED, _O.CANCEL): _NOOP,  # repeated cancel is harmless
        (_S.CANCEL_REQUESTED, _O.APPLY): _STALE,
        (_S.CANCEL_REQUESTED, _O.RELEASE): _RELEASE,
        (_S.RELEASED, _O.EXPIRE): _NOOP,
        (_S.RELEASED, _O.CANCEL): _NOOP,
        (_S.RELEASED, _O.APPLY): _STALE,
        (_S.RELEASED, _O.RELEASE): Transition(None, _R.DOUBLE_RELEASE, counter="double_release"),
        (_S.UNKNOWN, _O.EXPIRE): _UNKNOWN,
        (_S.UNKNOWN, _O.CANCEL): _UNKNOWN,
        (_S.UNKNOWN, _O.APPLY): _STALE,
        (_S.UNKNOWN, _O.RELEASE): Transition(None, _R.UNKNOWN, counter="stale_release"),
        # A lease of a lost epoch whose request is still out: count it again.
        (_S.FOREIGN, _O.EXPIRE): Transition(
            _S.EXPIRED, _R.CHANGED, in_flight=1, bump_generation=True, counter="adopted"
        ),
        (_S.FOREIGN, _O.CANCEL): Transition(
            _S.CANCEL_REQUESTED, _R.CHANGED, in_flight=1, counter="adopted"
        ),
        (_S.FOREIGN, _O.APPLY): _STALE,
        (_S.FOREIGN, _O.RELEASE): Transition(None, _R.UNKNOWN, counter="stale_release"),
    }
)

_HELD = (_S.LIVE, _S.EXPIRED, _S.CANCEL_REQUESTED)  # states that hold capacity


def transition(state: LeaseState, op: Op) -> Transition:
    """What ``op`` does to a lease in ``state`` (pure; the Lua script applies it)."""
    return TRANSITIONS[(LeaseState(state), Op(op))]


class AdmissionError(Exception):
    """Base of the admission desk's errors."""


class AdmissionRefused(AdmissionError):
    """No capacity could be held for this request: it must not be sent."""

    def __init__(self, reason: RefusalReason, eval_run: str) -> None:
        super().__init__(f"admission refused for eval-run {eval_run!r}: {reason.value}")
        self.reason = reason


class StaleCompletion(AdmissionError):
    """A completion whose lease is no longer live: its text must not be applied."""

    def __init__(self, reason: LeaseState, lease: Lease) -> None:
        super().__init__(
            f"stale completion for step {lease.step} (lease {lease.lease_id}, "
            f"generation {lease.generation}): lease is {reason.value}"
        )
        self.reason = reason
        self.lease = lease


class DeskMismatch(AdmissionError):
    """The eval-run's desk exists with another bound than this caller's."""


@dataclass(frozen=True)
class Lease:
    lease_id: str
    generation: int
    step: int
    epoch: str


@dataclass(frozen=True)
class DeskKeys:
    desk: str
    leases: str
    committed: str
    waiting: str

    @classmethod
    def of(cls, eval_run: str) -> DeskKeys:
        base = f"admission:{{{eval_run}}}"
        return cls(f"{base}:desk", f"{base}:leases", f"{base}:committed", f"{base}:waiting")


# Every script starts with the key layout and ensure_desk(): the desk is created on
# first use, or after Redis lost it, with a new epoch and in_flight rebuilt from the
# lease records that still hold capacity (none after a full loss).
_LUA_PRELUDE = """
-- The admission desk of one eval-run E (runner/admission.py). Keys:
--   admission:{E}:desk       HASH bound, epoch, in_flight, generation, ticket, counters
--   admission:{E}:leases     HASH lease id -> JSON {state, generation, step, epoch}
--   admission:{E}:committed  HASH step -> lease id of the one committed completion
--   admission:{E}:waiting    ZSET "<expiry_ms>:<lease id>", scored by arrival ticket
local HELD = HELD_SET
local function ensure_desk(desk, leases, bound, new_epoch)
  if redis.call('HSETNX', desk, 'epoch', new_epoch) == 1 then
    local held = 0
    for _, raw in ipairs(redis.call('HVALS', leases)) do
      if HELD[cjson.decode(raw).state] then held = held + 1 end
    end
    redis.call('HSET', desk, 'bound', bound, 'in_flight', held, 'generation', 0)
  end
  return tonumber(redis.call('HGET', desk, 'bound')), redis.call('HGET', desk, 'epoch')
end
"""

_ACQUIRE_BODY = """
-- acquire. KEYS: desk, leases, waiting. ARGV: bound, new_epoch, lease_id, step,
-- waiter ('' on the first call, else the queue entry it got), max_waiting,
-- wait_ttl_ms (0: refuse rather than queue). Capacity goes to a caller whose place
-- in the FIFO queue fits in the free capacity; queue entries past expiry belong to
-- dead processes and are dropped.
local desk, leases, waiting = KEYS[1], KEYS[2], KEYS[3]
local bound = tonumber(ARGV[1])
local stored, epoch = ensure_desk(desk, leases, ARGV[1], ARGV[2])
if stored ~= bound then return {'mismatch', tostring(stored)} end
local lease_id, step, waiter = ARGV[3], ARGV[4], ARGV[5]
local max_waiting, wait_ttl_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, member in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  local expiry = tonumber(string.match(member, '^(%d+):'))
  if expiry == nil or expiry < now_ms then redis.call('ZREM', waiting, member) end
end
local free = bound - tonumber(redis.call('HGET', desk, 'in_flight'))
local rank
if waiter == '' then
  rank = redis.call('ZCARD', waiting)
else
  rank = redis.call('ZRANK', waiting, waiter)
  if not rank then
    redis.call('HINCRBY', desk, 'refused', 1)
    return {'refused', 'deadline'}
  end
end
if rank < free then
  if waiter ~= '' then redis.call('ZREM', waiting, waiter) end
  local gen = redis.call('HINCRBY', desk, 'generation', 1)
  redis.call('HINCRBY', desk, 'in_flight', 1)
  redis.call('HINCRBY', desk, 'acquired', 1)
  redis.call('HSET', leases, lease_id, cjson.encode(
    {state = 'live', generation = tostring(gen), step = step, epoch = epoch}))
  return {'granted', tostring(gen), epoch}
end
if waiter ~= '' then return {'waiting', waiter} end
if wait_ttl_ms <= 0 then
  redis.call('HINCRBY', desk, 'refused', 1)
  return {'refused', 'bound'}
end
if rank >= max_waiting then
  redis.call('HINCRBY', desk, 'refused', 1)
  return {'refused', 'queue_full'}
end
local member = string.format('%d', now_ms + wait_ttl_ms) .. ':' .. lease_id
redis.call('ZADD', waiting, redis.call('HINCRBY', desk, 'ticket', 1), member)
return {'waiting', member}
"""

_GIVE_UP_BODY = """
-- give_up. KEYS: desk, leases, waiting. ARGV: bound, new_epoch, waiter.
-- The waiter's deadline passed: it leaves the queue, its request counts as refused.
ensure_desk(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('HINCRBY', KEYS[1], 'refused', 1)
return 1
"""

_TRANSITION_BODY = """
-- transition. KEYS: desk, leases, committed. ARGV: bound, new_epoch, op, lease_id,
-- generation, step, lease_epoch. Applies one cell of TRANSITIONS (the Python table,
-- embedded below as JSON) to one lease; a commit is HSETNX, so one per step.
local desk, leases, committed = KEYS[1], KEYS[2], KEYS[3]
local _, epoch = ensure_desk(desk, leases, ARGV[1], ARGV[2])
local op, lease_id, generation, step, lease_epoch = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local T = cjson.decode(TABLE_JSON)
local raw = redis.call('HGET', leases, lease_id)
local state, rec
if raw then
  rec = cjson.decode(raw)
  if rec.generation == generation and rec.step == step and rec.epoch == lease_epoch then
    state = rec.state
  else
    state = 'unknown'
  end
elseif lease_epoch ~= epoch then
  state = 'foreign'
else
  state = 'unknown'
end
local tr = T[state][op]
local result = tr.result
if result == 'commit' and redis.call('HSETNX', committed, step, lease_id) == 0 then
  result = 'duplicate'
  redis.call('HINCRBY', desk, 'duplicate_completion', 1)
end
if tr.to ~= '' then
  rec = rec or {generation = generation, step = step, epoch = lease_epoch}
  rec.state = tr.to
  redis.call('HSET', leases, lease_id, cjson.encode(rec))
end
if tr.in_flight < 0 and tonumber(redis.call('HGET', desk, 'in_flight')) <= 0 then
  redis.call('HINCRBY', desk, 'underflow_prevented', 1)
elseif tr.in_flight ~= 0 then
  redis.call('HINCRBY', desk, 'in_flight', tr.in_flight)
end
if tr.bump then redis.call('HINCRBY', desk, 'generation', 1) end
if tr.counter ~= '' then redis.call('HINCRBY', desk, tr.counter, 1) end
return {result, state}
"""


def _table_json() -> str:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for (state, op), tr in TRANSITIONS.items():
        table.setdefault(state.value, {})[op.value] = {
            "to": tr.to.value if tr.to else "",
            "result": tr.result.value,
            "in_flight": tr.in_flight,
            "bump": tr.bump_generation,
            "counter": tr.counter,
        }
    return json.dumps(table, sort_keys=True)


def _lua(body: str) -> str:
    held = "{" + ", ".join(f"{state.value} = true" for state in _HELD) + "}"
    return _LUA_PRELUDE.replace("HELD_SET", held) + body


_ACQUIRE_LUA = _lua(_ACQUIRE_BODY)
_GIVE_UP_LUA = _lua(_GIVE_UP_BODY)
_TRANSITION_LUA = _lua(_TRANSITION_BODY.replace("TABLE_JSON", f"[[{_table_json()}]]"))

# The desk's counts: the fixed fields, then every counter the transition table names.
_STAT_FIELDS = (
    *("bound", "in_flight", "generation", "acquired", "refused"),
    *("duplicate_completion", "underflow_prevented"),
    *sorted({tr.counter for tr in TRANSITIONS.values() if tr.counter}),
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class AdmissionDesk:
    """The admission desk of one eval-run (see the module docstring)."""

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
        self.eval_run = eval_run
        self.bound = bound
        self.max_waiting = max_waiting
        self.keys = DeskKeys.of(eval_run)
        self._redis = redis_client
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self._acquire_script = redis_client.register_script(_ACQUIRE_LUA)
        self._give_up_script = redis_client.register_script(_GIVE_UP_LUA)
        self._transition_script = redis_client.register_script(_TRANSITION_LUA)

    def acquire(self, step: int, deadline_s: float) -> Lease:
        """Hold capacity for one request of planner ``step``, waiting up to ``deadline_s``.

        Raises :class:`AdmissionRefused` (counted as ``refused``) when the bound is
        reached and the caller may not wait (``deadline_s == 0``), when
        ``max_waiting`` callers already wait in the run's shared queue (the limit is
        this caller's; the queue is everyone's), or when the deadline passes.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        if not (math.isfinite(deadline_s) and deadline_s >= 0):
            raise ValueError(f"deadline_s must be a finite number >= 0, got {deadline_s!r}")
        lease_id = uuid.uuid4().hex
        wait_ttl_ms = math.ceil((deadline_s + WAITER_GRACE_S) * 1000) if deadline_s > 0 else 0
        end_s = self._clock() + deadline_s
        waiter = ""
        try:
            while True:
                reply = [
                    _text(v)
                    for v in self._acquire_script(
                        keys=[self.keys.desk, self.keys.leases, self.keys.waiting],
                        args=[
                            self.bound,
                            uuid.uuid4().hex,
                            lease_id,
                            step,
                            waiter,
                            self.max_waiting,
                            wait_ttl_ms,
                        ],
                    )
                ]
                if reply[0] == "granted":
                    return Lease(lease_id, int(reply[1]), step, reply[2])
                if reply[0] == "mismatch":
                    raise DeskMismatch(
                        f"eval-run {self.eval_run!r} has an admission desk with bound "
                        f"{reply[1]}, this worker was configured with {self.bound}"
                    )
                if reply[0] == "refused":
                    waiter = ""
                    raise AdmissionRefused(RefusalReason(reply[1]), self.eval_run)
                waiter = reply[1]
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
        result, state = self._transition(Op.APPLY, lease)
        if result == Result.STALE:
            raise StaleCompletion(state, lease)
        return result == Result.COMMIT

    def release(self, lease: Lease) -> bool:
        """Return the lease's capacity: True once per lease, False (counted) after that."""
        return self._transition(Op.RELEASE, lease)[0] == Result.CHANGED

    def committed_lease(self, step: int) -> str | None:
        """The lease id whose completion committed ``step``, if any."""
        value = self._redis.hget(self.keys.committed, str(step))
        return None if value is None else _text(value)

    def epoch(self) -> str | None:
        """The desk's current epoch (None before first use)."""
        value = self._redis.hget(self.keys.desk, "epoch")
        return None if value is None else _text(value)

    def stats(self) -> dict[str, int]:
        """The desk's counts, read in one transaction (zeros before first use)."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hgetall(self.keys.desk)
        pipe.zcard(self.keys.waiting)
        pipe.hlen(self.keys.committed)
        desk, waiting, committed = pipe.execute()
        fields = {_text(k): _text(v) for k, v in desk.items()}
        stats = {name: int(fields.get(name, 0)) for name in _STAT_FIELDS}
        stats["bound"] = int(fields.get("bound", self.bound))
        stats["waiting"] = int(waiting)
        stats["committed"] = int(committed)
        return stats

    def _give_up(self, waiter: str) -> None:
        self._give_up_script(
            keys=[self.keys.desk, self.keys.leases, self.keys.waiting],
            args=[self.bound, uuid.uuid4().hex, waiter],
        )

    def _transition(self, op: Op, lease: Lease) -> tuple[Result, LeaseState]:
        if not isinstance(lease, Lease):
            raise TypeError(f"expected a Lease, got {type(lease).__name__}")
        reply = self._transition_script(
            keys=[self.keys.desk, self.keys.leases, self.keys.committed],
            args=[
                self.bound,
                uuid.uuid4().hex,
                op.value,
                lease.lease_id,
                str(lease.generation),
                str(lease.step),
                lease.epoch,
            ],
        )
        return Result(_text(reply[0])), LeaseState(_text(reply[1]))
