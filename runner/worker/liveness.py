"""Job liveness: at most one running attempt per job, proved by a heartbeat in Redis.

Celery's Redis broker delivers at least once: a job that outlives the visibility
timeout is handed to a second worker while the first still runs, and a dead
worker's job comes back. Each delivery therefore starts with :meth:`Liveness.claim`,
one Lua script over the keys of ``runner.core.keys``:

* the result is committed              -> ``Finished``: nothing to do;
* ``job:{id}:heartbeat`` exists         -> ``Live(attempt)``: another attempt runs; this
                                           delivery stays as a *watchdog* (:func:`acquire`)
                                           until that attempt ends or goes silent;
* otherwise                             -> ``job:{id}:attempt`` := max(it, local floor) + 1
                                           and set the heartbeat to the new number with
                                           a TTL, atomically: ``Claimed(attempt)``.

The *local floor* (``runner.worker.attempt_floor``, given a ``home``) is this host's durable
high-water mark of the job's attempts: a Redis that restarted without its data has
lost the counter, and without the floor the next claim would issue attempt 1 again
while an older attempt still runs (I5). The claim holds the floor's lock across
read -> script -> durable write of the new number, and a claim whose number cannot be
made durable ends its heartbeat and raises :class:`AttemptFloorError` before any work.
The floor is per host, like slot stamps. Across hosts, after a wipe, the pool's
*attempt epoch* (``slotrunner:attempts:epoch``) does it: a claim that brings evidence
of an older epoch (this host's witness file, ``runner/admission/witness.py``) marks
the re-created epoch reborn, and in a reborn epoch a job without a counter starts
above the epoch's birth on Redis's clock in ms: above every number any host issued
before the loss, including a frozen or dead host no live host can ask
(docs/architecture.md §Several hosts). The limit left: a host that never saw the old
epoch, claiming first after a loss, creates the new one unmarked, and numbers it
issues before any host with evidence claims are small again.
The same lock covers the host's kept results (``runner.jobs.result_copy``): a claim that
finds this host committed the job puts the result back into Redis if it was lost and
reports the job finished, so a wipe never runs a finished job again here.

The new attempt number fences every older attempt: it is in every envelope and slot
stamp, the janitor reclaims slots stamped with an older one, the job result commits
only for the current one (``runner.worker.job``), and the older attempt's own loop asks
:meth:`Liveness.stop_reason` before each step and stops. The running attempt renews
its heartbeat from a :class:`Heartbeat` thread (every ``heartbeat_interval_s``, TTL
``heartbeat_ttl_s``); the renewal is refused once the attempt is no longer current,
so a paused worker that wakes up learns it was superseded instead of reviving its
heartbeat. A job whose whole worker died therefore resumes within the broker's
visibility timeout (redelivery) plus the heartbeat TTL (takeover).

This is Temporal's heartbeat timeout, built on Celery.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from runner.admission.witness import EpochMemory, EpochWitness
from runner.core import keys
from runner.core.logs import EventLog
from runner.jobs import events as job_events
from runner.jobs import result_copy
from runner.jobs.config import JobConfig
from runner.worker.attempt_floor import AttemptFloor, AttemptFloorError

# KEYS: attempt, heartbeat, result, jobs zset, epoch
# ARGV: ttl_ms, job_id, now_epoch_s, floor, evidence, new_epoch
# ``floor`` is the host's durable high-water attempt (0 without one): after a Redis
# wipe the counter restarts above it, never at 1, on this host. ``evidence`` is an
# epoch this host saw before ('' when none): when it is not the current one, Redis
# lost its data since, the epoch is marked reborn, and a job without a counter starts
# above the epoch's birth (Redis's clock, in ms), so above every number any host
# issued before the loss, a dead or frozen host's too. ``new_epoch`` names the epoch
# this call creates when there is none.
# The submit time is recorded (NX) here for jobs enqueued by plain Celery, whose
# deadline then counts from their first delivery.
_CLAIM = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {'finished', 0, '', ''} end
local epoch = redis.call('HGET', KEYS[5], 'id')
if not epoch then
  local now = redis.call('TIME')
  local born = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local reborn = '0'
  if ARGV[5] ~= '' then reborn = '1' end
  redis.call('HSET', KEYS[5], 'id', ARGV[6], 'born_ms', string.format('%d', born),
             'reborn', reborn)
  epoch = ARGV[6]
elseif ARGV[5] ~= '' and ARGV[5] ~= epoch then
  redis.call('HSET', KEYS[5], 'reborn', '1')
end
local live = redis.call('GET', KEYS[2])
if live then return {'live', tonumber(live), '', epoch} end
local counter = redis.call('GET', KEYS[1])
local base = 0
if not counter and redis.call('HGET', KEYS[5], 'reborn') == '1' then
  base = tonumber(redis.call('HGET', KEYS[5], 'born_ms'))
end
local attempt = math.max(tonumber(counter or '0'), tonumber(ARGV[4]), base) + 1
redis.call('SET', KEYS[1], string.format('%d', attempt))
redis.call('SET', KEYS[2], string.format('%d', attempt), 'PX', ARGV[1])
redis.call('ZADD', KEYS[4], 'NX', ARGV[3], ARGV[2])
return {'claimed', attempt, redis.call('ZSCORE', KEYS[4], ARGV[2]), epoch}
"""

# KEYS: attempt, heartbeat   ARGV: attempt, ttl_ms
# Renew only while still the current attempt; a heartbeat that lapsed during a pause
# may be set again only if nobody took over meanwhile (the attempt key says so).
_BEAT = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return 0 end
local live = redis.call('GET', KEYS[2])
if live and tonumber(live) ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: heartbeat   ARGV: attempt -- end our heartbeat, never a successor's
_END = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# The pool's attempt epoch's witness: ``$SLOTRUNNER_HOME/attempts-epoch/<hash>.json``.
EPOCH_NAME = "slotrunner attempt numbers"
EPOCH_DIR = "attempts-epoch"

SUPERSEDED = "superseded"
CANCELLED = "cancelled"


@dataclass(frozen=True)
class Claimed:
    attempt: int
    submitted_at: float  # epoch seconds; the job's deadline counts from here
    took_over_from: int | None = None


@dataclass(frozen=True)
class Live:
    attempt: int


@dataclass(frozen=True)
class Finished:
    pass


class Liveness:
    """The Redis side of one job's liveness.

    ``home`` (``$SLOTRUNNER_HOME``) turns on the local attempt floor; without it the
    attempt numbers rest on Redis alone and a Redis wipe can reissue them.
    """

    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        config: JobConfig,
        clock: Callable[[], float] = time.time,
        *,
        home: Path | None = None,
    ) -> None:
        self.redis = client
        self.job_id = job_id
        self.config = config
        self.clock = clock
        self.home = home
        self.floor = AttemptFloor(home, job_id) if home is not None else None
        witness = EpochWitness(home, EPOCH_NAME, directory=EPOCH_DIR) if home else None
        self.epochs = EpochMemory(witness)
        self._claim = client.register_script(_CLAIM)
        self._beat = client.register_script(_BEAT)
        self._end = client.register_script(_END)

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.config.heartbeat_ttl_s * 1000))

    def claim(self) -> Claimed | Live | Finished:
        """Claim a new attempt (see the module docstring); raises AttemptFloorError."""
        if self.floor is None:
            return self._run_claim(0)
        with self.floor.locked():
            if self._kept_result():
                return Finished()
            state = self._run_claim(self.floor.read())
            if isinstance(state, Claimed):
                self._record(self.floor, state.attempt)
            return state

    def _witness(self, epoch: str, state: Claimed | Live | Finished) -> None:
        """Remember the pool's attempt epoch on this host; a claim whose epoch cannot be
        made durable is given up before any work (a process started after the next
        Redis loss would not know there was one, and could reissue a number)."""
        if not epoch or self.epochs.saw(epoch) or not isinstance(state, Claimed):
            return
        assert self.epochs.witness is not None
        with contextlib.suppress(redis.RedisError):
            self.end(state.attempt)
        raise AttemptFloorError(
            f"job {self.job_id}: attempt {state.attempt} was not started because the "
            f"pool's attempt epoch could not be made durable in {self.epochs.witness.path}"
        )

    def _kept_result(self) -> bool:
        """True when this host committed the job's result (put back into Redis if lost)."""
        assert self.home is not None
        try:
            kept = result_copy.load(self.home, self.job_id)
        except result_copy.ResultCopyError:
            return False  # unusable: the job may run again (see runner.jobs.result_copy)
        if kept is None:
            return False
        result_copy.republish(self.redis, kept)
        return True

    def _record(self, floor: AttemptFloor, attempt: int) -> None:
        """Make ``attempt`` durable in the floor, or give the claim up before any work."""
        try:
            floor.raise_to(attempt)
        except (OSError, AttemptFloorError) as exc:
            # The number is burnt, not reused: the Redis counter already holds it, so the
            # next claim issues a higher one. Ending the heartbeat lets that claim come
            # at once instead of after the TTL; failing to end it only delays it.
            with contextlib.suppress(redis.RedisError):
                self.end(attempt)
            raise AttemptFloorError(
                f"job {self.job_id}: attempt {attempt} was not started because its number "
                f"could not be made durable in {floor.path}: {exc}"
            ) from exc

    def _run_claim(self, floor: int) -> Claimed | Live | Finished:
        kind, attempt, submitted, epoch = self._claim(
            keys=[
                keys.job_attempt(self.job_id),
                keys.job_heartbeat(self.job_id),
                keys.job_result(self.job_id),
                keys.JOBS,
                keys.ATTEMPT_EPOCH,
            ],
            args=[
                self.ttl_ms,
                self.job_id,
                repr(self.clock()),
                floor,
                self.epochs.evidence(),
                uuid.uuid4().hex,
            ],
        )
        state: Claimed | Live | Finished
        if kind == "finished":
            state = Finished()
        elif kind == "live":
            state = Live(int(attempt))
        else:
            state = Claimed(int(attempt), float(submitted))
        self._witness(epoch.decode() if isinstance(epoch, bytes) else str(epoch or ""), state)
        return state

    def beat(self, attempt: int) -> bool:
        """Renew the heartbeat; False once ``attempt`` is no longer the current one."""
        renewed = self._beat(
            keys=[keys.job_attempt(self.job_id), keys.job_heartbeat(self.job_id)],
            args=[attempt, self.ttl_ms],
        )
        return bool(renewed == 1)

    def end(self, attempt: int) -> None:
        self._end(keys=[keys.job_heartbeat(self.job_id)], args=[attempt])

    def stop_reason(self, attempt: int) -> str | None:
        """Why ``attempt`` must not take another step: superseded, cancelled, or None."""
        current, cancel = self.redis.mget(
            keys.job_attempt(self.job_id), keys.job_cancel(self.job_id)
        )
        if int(current or 0) != attempt:
            return SUPERSEDED
        if cancel is not None:
            return CANCELLED
        return None

    def cancel_requested(self) -> bool:
        return bool(self.redis.exists(keys.job_cancel(self.job_id)))


def acquire(
    liveness: Liveness,
    log: EventLog,
    *,
    sleep: Callable[[float], None] = time.sleep,
    **fields: Any,
) -> Claimed | Finished:
    """Claim a new attempt, or watch the live one until it finishes or goes silent.

    A watchdog holds its Celery delivery (acks late) for as long as it watches, so a
    job never loses its last deliverable copy while its attempt is merely alive.
    """
    watching: int | None = None
    while True:
        state = liveness.claim()
        if isinstance(state, Finished):
            return state
        if isinstance(state, Claimed):
            if watching is None:
                return state
            log.emit(
                job_events.JOB_TAKEOVER,
                job_id=liveness.job_id,
                attempt=state.attempt,
                stale_attempt=watching,
                **fields,
            )
            return Claimed(state.attempt, state.submitted_at, took_over_from=watching)
        if watching != state.attempt:
            watching = state.attempt
            log.emit(job_events.JOB_WATCHDOG, job_id=liveness.job_id, attempt=watching, **fields)
        sleep(liveness.config.watchdog_poll_s)


class Heartbeat:
    """A daemon thread that keeps one attempt's heartbeat alive while it runs.

    After each renewal it runs ``on_tick`` (the job renews its slot lease there); an
    error in it is logged, never fatal, since the next tick tries again. A refused
    renewal sets :attr:`superseded` and ends the thread.
    """

    def __init__(
        self,
        liveness: Liveness,
        attempt: int,
        log: EventLog,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.liveness = liveness
        self.attempt = attempt
        self.log = log
        self.on_tick = on_tick
        self.superseded = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{liveness.job_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.liveness.config.heartbeat_ttl_s)
        # Best effort: a heartbeat we fail to delete expires on its own.
        with contextlib.suppress(redis.RedisError):
            self.liveness.end(self.attempt)

    def _run(self) -> None:
        interval_s = self.liveness.config.heartbeat_interval_s
        while not self._stop.wait(interval_s):
            try:
                current = self.liveness.beat(self.attempt)
            except redis.RedisError as exc:
                # Transient: if it lasts past the TTL another copy takes over and
                # the next renewal is refused, which is the safe outcome.
                self._error("renew", exc)
                continue
            if not current:
                self.superseded.set()
                return
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except Exception as exc:
                    self._error("tick", exc)

    def _error(self, where: str, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            self.log.emit(
                job_events.JOB_HEARTBEAT_ERROR,
                job_id=self.liveness.job_id,
                attempt=self.attempt,
                where=where,
                error=f"{type(exc).__name__}: {exc}",
            )
