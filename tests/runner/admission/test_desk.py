"""The admission desk against a real Redis: each operation, and processes racing.

Any interleaving against a reference model: ``tests/runner/admission/test_desk_model.py``.
"""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import (
    AdmissionRefused,
    DeskMismatch,
    Lease,
    RefusalReason,
    StaleCompletion,
)
from runner.admission.table import TRANSITIONS, LeaseState, Op, transition
from tests.support.clock import FakeClock

DeskFactory = Callable[..., AdmissionDesk]


@pytest.fixture
def make_desk(redis_client: redis.Redis) -> Iterator[DeskFactory]:
    """Desks on fresh eval-runs (unique names), deleted after the test."""
    made: list[AdmissionDesk] = []

    def make(bound: int = 2, eval_run: str | None = None, **kwargs: object) -> AdmissionDesk:
        desk = AdmissionDesk(
            redis_client,
            eval_run or f"test-{uuid.uuid4().hex[:12]}",
            bound,
            **kwargs,  # type: ignore[arg-type]
        )
        made.append(desk)
        return desk

    yield make
    for desk in made:
        redis_client.delete(*vars(desk.keys).values())


# --- the state machine, cell by cell -------------------------------------------------

# Written out by hand: (state, op) -> (new state or None, result, in_flight change).
EXPECTED_TABLE = {
    ("live", "expire"): ("expired", "changed", 0),
    ("live", "cancel"): ("cancel_requested", "changed", 0),
    ("live", "apply"): (None, "commit", 0),
    ("live", "release"): ("released", "changed", -1),
    ("expired", "expire"): (None, "noop", 0),
    ("expired", "cancel"): (None, "noop", 0),
    ("expired", "apply"): (None, "stale", 0),
    ("expired", "release"): ("released", "changed", -1),
    ("cancel_requested", "expire"): (None, "noop", 0),
    ("cancel_requested", "cancel"): (None, "noop", 0),
    ("cancel_requested", "apply"): (None, "stale", 0),
    ("cancel_requested", "release"): ("released", "changed", -1),
    ("released", "expire"): (None, "noop", 0),
    ("released", "cancel"): (None, "noop", 0),
    ("released", "apply"): (None, "stale", 0),
    ("released", "release"): (None, "double_release", 0),
    ("unknown", "expire"): (None, "unknown", 0),
    ("unknown", "cancel"): (None, "unknown", 0),
    ("unknown", "apply"): (None, "stale", 0),
    ("unknown", "release"): (None, "unknown", 0),
    ("foreign", "expire"): ("expired", "changed", 1),
    ("foreign", "cancel"): ("cancel_requested", "changed", 1),
    ("foreign", "apply"): (None, "stale", 0),
    ("foreign", "release"): (None, "unknown", 0),
}


@pytest.mark.parametrize(("state", "op"), list(EXPECTED_TABLE))
def test_transition_table_cell(state: str, op: str) -> None:
    """Every (state, op) cell matches the hand-written table."""
    to, result, delta = EXPECTED_TABLE[(state, op)]
    got = transition(LeaseState(state), Op(op))
    assert (got.to, got.result, got.in_flight) == (to, result, delta)


def test_transition_table_is_total_and_only_expire_bumps_the_generation() -> None:
    """The table covers every state and op; only expire (and adopt-by-expire) fences."""
    assert set(TRANSITIONS) == {(s, o) for s in LeaseState for o in Op}
    bumping = {key for key, tr in TRANSITIONS.items() if tr.bump_generation}
    assert bumping == {(LeaseState.LIVE, Op.EXPIRE), (LeaseState.FOREIGN, Op.EXPIRE)}
    # Capacity is only ever returned by a release of a lease that holds it.
    returning = {key for key, tr in TRANSITIONS.items() if tr.in_flight < 0}
    held = {LeaseState.LIVE, LeaseState.EXPIRED, LeaseState.CANCEL_REQUESTED}
    assert returning == {(s, Op.RELEASE) for s in held}


# --- each operation ------------------------------------------------------------------


def test_acquire_grants_up_to_the_bound_then_refuses(make_desk: DeskFactory) -> None:
    """Leases get increasing generations; at the bound a no-wait acquire is refused and counted."""
    desk = make_desk(bound=2)
    first, second = desk.acquire(1, 0), desk.acquire(2, 0)
    assert (first.generation, second.generation) == (1, 2)
    assert first.epoch == second.epoch == desk.epoch()
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(3, 0)
    assert refused.value.reason is RefusalReason.BOUND
    stats = desk.stats()
    assert (stats["in_flight"], stats["acquired"], stats["refused"]) == (2, 2, 1)


def test_waiting_until_the_deadline_is_refused_and_leaves_the_queue(
    make_desk: DeskFactory,
) -> None:
    """A waiter that never gets capacity is refused at its deadline, counted, and dequeued."""
    clock = FakeClock()
    desk = make_desk(bound=1, clock=clock, sleep=clock.sleep, poll_s=0.25)
    desk.acquire(1, 0)
    waiting_seen: list[int] = []
    clock.on_sleep = lambda: waiting_seen.append(desk.stats()["waiting"])
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(2, 2.0)
    assert refused.value.reason is RefusalReason.DEADLINE
    assert clock.sleeps == 8 and set(waiting_seen) == {1}
    stats = desk.stats()
    assert (stats["waiting"], stats["refused"], stats["in_flight"]) == (0, 1, 1)


def test_a_waiter_gets_the_capacity_a_release_returns(make_desk: DeskFactory) -> None:
    """A release by another worker while one waits hands the capacity to the waiter."""
    clock = FakeClock()
    desk = make_desk(bound=1, clock=clock, sleep=clock.sleep)
    held = desk.acquire(1, 0)
    clock.on_sleep = lambda: desk.release(held)
    lease = desk.acquire(2, 30.0)
    assert lease.step == 2 and clock.sleeps == 1
    assert desk.stats()["in_flight"] == 1


def test_waiters_are_served_in_arrival_order(make_desk: DeskFactory) -> None:
    """Freed capacity goes to the queued waiter, not to a newcomer that does not wait."""
    clock = FakeClock()
    desk = make_desk(bound=1, clock=clock, sleep=clock.sleep)
    held = desk.acquire(1, 0)
    outcomes: list[str] = []

    def other_worker() -> None:
        if not outcomes:
            desk.release(held)
            try:
                desk.acquire(99, 0)
                outcomes.append("newcomer granted")
            except AdmissionRefused as exc:
                outcomes.append(f"newcomer {exc.reason}")

    clock.on_sleep = other_worker
    assert desk.acquire(2, 30.0).step == 2
    assert outcomes == ["newcomer bound"]


def test_beyond_max_waiting_is_refused_at_once(make_desk: DeskFactory) -> None:
    """With max_waiting callers queued, the next caller is refused queue_full without waiting."""
    clock = FakeClock()
    eval_run = f"test-{uuid.uuid4().hex[:12]}"
    desk = make_desk(bound=1, eval_run=eval_run, clock=clock, sleep=clock.sleep, max_waiting=1)
    other = make_desk(bound=1, eval_run=eval_run, max_waiting=1)
    desk.acquire(1, 0)
    reasons: list[RefusalReason] = []

    def second_caller() -> None:
        if reasons:
            return
        try:
            other.acquire(3, 10.0)
        except AdmissionRefused as exc:
            reasons.append(exc.reason)

    clock.on_sleep = second_caller
    with pytest.raises(AdmissionRefused, match=r": deadline$"):
        desk.acquire(2, 0.1)
    assert reasons == [RefusalReason.QUEUE_FULL]
    assert desk.stats()["refused"] == 2


def test_an_abandoned_queue_entry_is_dropped(
    make_desk: DeskFactory, redis_client: redis.Redis
) -> None:
    """A waiter whose process died (its entry past expiry) does not hold the queue."""
    desk = make_desk(bound=1)
    held = desk.acquire(1, 0)
    redis_client.zadd(desk.keys.waiting, {"1:deadbeef": 1})  # expired long ago
    assert desk.stats()["waiting"] == 1
    desk.release(held)
    assert desk.acquire(2, 0).step == 2  # refused if the dead entry still queued ahead
    assert desk.stats()["waiting"] == 0


def test_an_interrupted_wait_leaves_the_queue(make_desk: DeskFactory) -> None:
    """An exception while queued removes the waiter and counts the refusal."""
    clock = FakeClock()
    desk = make_desk(bound=1, clock=clock, sleep=clock.sleep)
    desk.acquire(1, 0)

    def interrupt() -> None:
        raise KeyboardInterrupt

    clock.on_sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        desk.acquire(2, 10.0)
    stats = desk.stats()
    assert (stats["waiting"], stats["refused"]) == (0, 1)


def test_expire_fences_the_late_completion_but_keeps_capacity(make_desk: DeskFactory) -> None:
    """expire bumps the generation, keeps in_flight; the late body is stale; release frees."""
    desk = make_desk(bound=1)
    lease = desk.acquire(4, 0)
    assert desk.expire(lease) is True
    assert desk.expire(lease) is False  # a second timer firing changes nothing
    stats = desk.stats()
    assert (stats["generation"], stats["in_flight"], stats["expired"]) == (2, 1, 1)
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(lease)
    assert stale.value.reason is LeaseState.EXPIRED
    assert desk.committed_lease(4) is None
    with pytest.raises(AdmissionRefused, match=r": bound$"):
        desk.acquire(5, 0)  # the expired request still holds the only slot
    assert desk.release(lease) is True
    assert desk.stats()["in_flight"] == 0


def test_timeout_retry_and_late_body(make_desk: DeskFactory) -> None:
    """Timeout, retry, late body: the retry's completion commits, the original's is rejected."""
    desk = make_desk(bound=2)
    original = desk.acquire(7, 0)
    desk.expire(original)
    retry = desk.acquire(7, 0)
    assert retry.generation > original.generation
    with pytest.raises(StaleCompletion, match="lease is expired"):
        desk.apply(original)
    assert desk.apply(retry) is True
    assert desk.committed_lease(7) == retry.lease_id
    assert desk.release(original) and desk.release(retry)
    stats = desk.stats()
    assert (stats["committed"], stats["stale_completion"], stats["in_flight"]) == (1, 1, 0)


def test_at_most_one_commit_per_step(make_desk: DeskFactory) -> None:
    """Two live leases of one step: the first completion commits, the second is a duplicate."""
    desk = make_desk(bound=3)
    one, two = desk.acquire(3, 0), desk.acquire(3, 0)
    assert desk.apply(two) is True
    assert desk.apply(one) is False
    assert desk.apply(two) is False  # the same body delivered twice
    assert desk.committed_lease(3) == two.lease_id
    stats = desk.stats()
    assert (stats["committed"], stats["duplicate_completion"]) == (1, 2)


def test_double_release_is_recorded_not_decremented(make_desk: DeskFactory) -> None:
    """A second release returns False, counts double_release and leaves in_flight alone."""
    desk = make_desk(bound=2)
    first, second = desk.acquire(1, 0), desk.acquire(2, 0)
    assert desk.release(first) is True
    assert desk.release(first) is False
    assert desk.release(first) is False
    stats = desk.stats()
    assert (stats["in_flight"], stats["double_release"], stats["released"]) == (1, 2, 1)
    assert desk.release(second) is True
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(second)
    assert stale.value.reason is LeaseState.RELEASED


def test_cancel_keeps_capacity_until_the_release_confirms(make_desk: DeskFactory) -> None:
    """cancel_requested holds the capacity, rejects the body, and repeats are harmless."""
    desk = make_desk(bound=1)
    lease = desk.acquire(1, 0)
    assert desk.cancel(lease) is True
    assert desk.cancel(lease) is False
    with pytest.raises(AdmissionRefused, match=r": bound$"):
        desk.acquire(2, 0)
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(lease)
    assert stale.value.reason is LeaseState.CANCEL_REQUESTED
    assert desk.release(lease) is True
    stats = desk.stats()
    assert (stats["cancelled"], stats["in_flight"], stats["committed"]) == (1, 0, 0)
    assert desk.acquire(2, 0).step == 2


def test_a_completion_before_the_cancel_stays_committed(make_desk: DeskFactory) -> None:
    """Cancel racing completion: when the completion won, its commit stands."""
    desk = make_desk(bound=1)
    lease = desk.acquire(1, 0)
    assert desk.apply(lease) is True
    assert desk.cancel(lease) is True
    assert desk.committed_lease(1) == lease.lease_id
    assert desk.release(lease) is True


def test_a_forged_lease_is_stale_and_frees_nothing(make_desk: DeskFactory) -> None:
    """A lease whose generation is not the one on record is unknown: never applied, never freed."""
    desk = make_desk(bound=1)
    lease = desk.acquire(1, 0)
    forged = Lease(lease.lease_id, lease.generation + 1, lease.step, lease.epoch)
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(forged)
    assert stale.value.reason is LeaseState.UNKNOWN
    assert desk.release(forged) is False
    assert desk.expire(forged) is False
    stats = desk.stats()
    assert (stats["in_flight"], stats["stale_release"], stats["expired"]) == (1, 1, 0)


def test_redis_losing_the_desk_never_frees_capacity_twice(
    make_desk: DeskFactory, redis_client: redis.Redis
) -> None:
    """After an empty restart old leases are foreign: stale, no decrement, adopted on expire.

    With no recovery hold (0 s), so that what bounds the grants is the adopted lease."""
    desk = make_desk(bound=1, recovery_hold_s=0.0)
    done = desk.acquire(1, 0)
    desk.release(done)
    out = desk.acquire(2, 0)  # its request is still in the backend when Redis loses data
    old_epoch = desk.epoch()
    redis_client.delete(*vars(desk.keys).values())

    assert desk.release(done) is False  # never negative
    assert desk.stats()["in_flight"] == 0
    assert desk.epoch() not in (None, old_epoch)
    assert desk.expire(out) is True  # the still-running request is counted again
    stats = desk.stats()
    assert (stats["in_flight"], stats["adopted"]) == (1, 1)
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(3, 0)  # the adopted request holds the bound
    assert refused.value.reason is RefusalReason.BOUND
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(out)
    assert stale.value.reason is LeaseState.EXPIRED
    assert desk.release(out) is True
    assert desk.release(out) is False
    stats = desk.stats()
    assert (stats["in_flight"], stats["underflow_prevented"], stats["recoveries"]) == (0, 0, 1)


def test_a_lost_lease_completion_is_stale(
    make_desk: DeskFactory, redis_client: redis.Redis
) -> None:
    """A completion of a lease granted before the data loss cannot commit: its fence is gone."""
    desk = make_desk(bound=2)
    lease = desk.acquire(1, 0)
    redis_client.delete(*vars(desk.keys).values())
    with pytest.raises(StaleCompletion) as stale:
        desk.apply(lease)
    assert stale.value.reason is LeaseState.FOREIGN
    assert desk.stats()["committed"] == 0


def test_in_flight_is_rebuilt_from_surviving_leases(
    make_desk: DeskFactory, redis_client: redis.Redis
) -> None:
    """If only the desk hash is lost, in_flight is recounted from the lease records."""
    desk = make_desk(bound=3)
    held, expired, released = desk.acquire(1, 0), desk.acquire(2, 0), desk.acquire(3, 0)
    desk.expire(expired)
    desk.release(released)
    redis_client.delete(desk.keys.desk)
    assert desk.stats()["in_flight"] == 0  # nothing re-created yet
    assert desk.release(held) is True  # the next call rebuilds: 2 held, then 1 released
    assert desk.stats()["in_flight"] == 1


def test_a_bytes_client_works(redis_url: str) -> None:
    """The desk works with a client that does not decode responses."""
    client = redis.Redis.from_url(redis_url)
    try:
        desk = AdmissionDesk(client, f"test-{uuid.uuid4().hex[:12]}", 1)
        lease = desk.acquire(1, 0)
        assert desk.apply(lease) is True
        assert desk.committed_lease(1) == lease.lease_id
        assert desk.release(lease) is True
        assert desk.stats()["committed"] == 1
        client.delete(*vars(desk.keys).values())
    finally:
        client.close()


def test_a_second_bound_for_one_eval_run_is_an_error(make_desk: DeskFactory) -> None:
    """Workers configured with different bounds for one eval-run are told so."""
    eval_run = f"test-{uuid.uuid4().hex[:12]}"
    make_desk(bound=2, eval_run=eval_run).acquire(1, 0)
    with pytest.raises(DeskMismatch, match=r"bound 2.*configured with 5"):
        make_desk(bound=5, eval_run=eval_run).acquire(2, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bound": 0}, "bound"),
        ({"bound": True}, "bound"),
        ({"eval_run": ""}, "eval_run"),
        ({"eval_run": "a b"}, "eval_run"),
        ({"eval_run": "run}{x"}, "eval_run"),
        ({"eval_run": "x" * 201}, "eval_run"),
        ({"max_waiting": -1}, "max_waiting"),
        ({"poll_s": 0.0}, "poll_s"),
        ({"recovery_hold_s": -1.0}, "recovery_hold_s"),
        ({"recovery_hold_s": float("nan")}, "recovery_hold_s"),
    ],
)
def test_bad_desk_arguments_are_named(
    redis_client: redis.Redis, kwargs: dict[str, object], message: str
) -> None:
    """Nonsense configuration raises ValueError naming the argument."""
    args: dict[str, object] = {"eval_run": "ok", "bound": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        AdmissionDesk(redis_client, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step", "deadline_s", "message"),
    [
        (-1, 0, "step"),
        (True, 0, "step"),
        (1.5, 0, "step"),
        (1, -1.0, "deadline_s"),
        (1, float("nan"), "deadline_s"),
        (1, float("inf"), "deadline_s"),
    ],
)
def test_bad_acquire_arguments_are_named(
    make_desk: DeskFactory, step: object, deadline_s: float, message: str
) -> None:
    """A bad step or deadline raises ValueError naming it, and nothing is counted."""
    desk = make_desk()
    with pytest.raises(ValueError, match=message):
        desk.acquire(step, deadline_s)  # type: ignore[arg-type]
    assert desk.stats()["acquired"] == 0


# --- real concurrency: four OS processes on one desk ---------------------------------


def _hammer(url: str, eval_run: str, bound: int, worker: int, rounds: int) -> None:
    """One worker process: acquire, hold, complete or time out or cancel, release."""
    client = redis.Redis.from_url(url, decode_responses=True)
    desk = AdmissionDesk(client, eval_run, bound, poll_s=0.001, max_waiting=8)
    rng = random.Random(worker)
    probe = f"test:{eval_run}:holding"
    for _ in range(rounds):
        step = rng.randrange(rounds)  # steps shared across workers: completions race
        try:
            lease = desk.acquire(step, 30.0)
        except AdmissionRefused:
            client.incr(f"test:{eval_run}:refused")
            continue
        # Counted between grant and release, so it can never exceed the leases held.
        if client.incr(probe) > bound:
            client.incr(f"test:{eval_run}:over_bound")
        roll = rng.random()
        if roll < 0.3:
            desk.expire(lease)
            try:
                desk.apply(lease)
                client.incr(f"test:{eval_run}:late_committed")
            except StaleCompletion:
                pass
        elif roll < 0.4:
            desk.cancel(lease)
        elif desk.apply(lease):
            client.rpush(f"test:{eval_run}:commits", step)
        client.decr(probe)
        assert desk.release(lease) is True
        if rng.random() < 0.1:
            assert desk.release(lease) is False
    client.close()


def test_four_processes_never_exceed_the_bound(
    make_desk: DeskFactory, redis_client: redis.Redis, redis_url: str
) -> None:
    """Four processes hammer one bound-3 desk; a monitor never sees in_flight above 3."""
    bound, rounds = 3, 150
    desk = make_desk(bound=bound)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_hammer, args=(redis_url, desk.eval_run, bound, w, rounds))
        for w in range(4)
    ]
    for proc in procs:
        proc.start()
    samples, highest = 0, 0
    give_up_at = time.monotonic() + 90.0
    try:
        while any(proc.is_alive() for proc in procs) and time.monotonic() < give_up_at:
            in_flight = int(redis_client.hget(desk.keys.desk, "in_flight") or 0)
            assert 0 <= in_flight <= bound, f"in_flight {in_flight} outside [0, {bound}]"
            highest = max(highest, in_flight)
            samples += 1
    finally:
        for proc in procs:
            proc.join(timeout=max(0.0, give_up_at - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    prefix = f"test:{desk.eval_run}"
    counters = {
        name: int(redis_client.get(f"{prefix}:{name}") or 0)
        for name in ("over_bound", "late_committed", "refused")
    }
    commits = redis_client.lrange(f"{prefix}:commits", 0, -1)
    redis_client.delete(
        *(
            f"{prefix}:{n}"
            for n in ("over_bound", "late_committed", "refused", "commits", "holding")
        )
    )
    stats = desk.stats()
    print(f"{samples} samples, highest in_flight {highest}, stats {stats}")
    assert counters["over_bound"] == counters["late_committed"] == 0
    assert len(commits) == len(set(commits)) == stats["committed"]  # P2 across processes
    assert stats["in_flight"] == 0 and stats["waiting"] == 0
    assert stats["acquired"] + stats["refused"] == 4 * rounds
    assert stats["refused"] == counters["refused"]
