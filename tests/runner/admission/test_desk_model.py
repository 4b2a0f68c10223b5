"""The admission desk against a reference model, on a real Redis: P1-P4 after every step.

A hypothesis state machine drives one real desk (``runner/admission/desk.py``) through
acquires (some waiting while another worker gives capacity back), local timeouts,
completions (late, duplicate, stale), releases, double releases and cancels, and
checks after every step the properties of docs/architecture.md §Admission: in-flight
within ``[0, bound]`` (P1), at most one commit per step (P2), commits only from live
leases (P3), stale completions refused (P4), and capacity returned exactly once per
lease (I7). The model predicts every answer and every counter independently of the
desk. A second driver, seeded, measures duplicate commits per 100 injected
timeout-then-late-completion pairs.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import AdmissionRefused, Lease, RefusalReason, StaleCompletion
from runner.admission.table import LeaseState
from tests.support.clock import FakeClock

HOLDING = frozenset({LeaseState.LIVE, LeaseState.EXPIRED, LeaseState.CANCEL_REQUESTED})
COUNTERS = (
    *("acquired", "refused", "expired", "cancelled", "released"),
    *("stale_completion", "duplicate_completion", "double_release"),
)


@dataclass
class Held:
    lease: Lease
    state: LeaseState = LeaseState.LIVE
    completions: int = 0


@dataclass
class DeskModel:
    """What the desk must answer, predicted independently; each call asserts the answer."""

    desk: AdmissionDesk
    clock: FakeClock
    bound: int
    leases: list[Held] = field(default_factory=list)
    commits: dict[int, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    generation: int = 0
    next_step: int = 0
    pairs: int = 0  # timeout-then-late-completion pairs delivered
    duplicate_commits: int = 0  # commits of a step already committed: must stay 0

    def in_state(self, *states: LeaseState) -> list[Held]:
        return [held for held in self.leases if held.state in states]

    def holding(self) -> list[Held]:
        return self.in_state(*HOLDING)

    def acquire(self, step: int | None, *, wait: bool, frees: Held | None = None) -> Held | None:
        """A lease for ``step`` (a new step when None). Waiting at the bound, ``frees`` is
        the holder another worker releases meanwhile (None: nobody, the wait times out)."""
        if step is None:
            step, self.next_step = self.next_step, self.next_step + 1
        at_bound = len(self.holding()) >= self.bound
        freed: list[Held] = []
        if wait and at_bound and frees is not None:
            assert frees.state in HOLDING

            def other_worker() -> None:
                if not freed:
                    freed.append(frees)
                    assert self.desk.release(frees.lease) is True

            self.clock.on_sleep = other_worker
        try:
            lease = self.desk.acquire(step, 1.0 if wait else 0.0)
        except AdmissionRefused as exc:
            assert at_bound and not freed, "refused although capacity was free"
            assert exc.reason is (RefusalReason.DEADLINE if wait else RefusalReason.BOUND)
            self.counts["refused"] += 1
            return None
        finally:
            self.clock.on_sleep = None
        for held in freed:
            held.state = LeaseState.RELEASED
            self.counts["released"] += 1
        assert not at_bound or freed, "P1: granted beyond the bound"
        self.generation += 1
        assert (lease.generation, lease.step) == (self.generation, step)
        self.counts["acquired"] += 1
        held = Held(lease)
        self.leases.append(held)
        return held

    def complete(self, held: Held) -> bool:
        """A completion of ``held`` arrives; True when it committed its step."""
        late = held.state is LeaseState.EXPIRED and held.completions == 0
        held.completions += 1
        before = held.state
        if late:
            self.pairs += 1
        try:
            committed = self.desk.apply(held.lease)
        except StaleCompletion as exc:
            assert before is not LeaseState.LIVE, "a live lease's completion was refused"
            assert exc.reason is before  # P4 for expired leases, the same for the others
            self.counts["stale_completion"] += 1
            return False
        assert before is LeaseState.LIVE, "P3/P4: a lease that was not live committed"
        if not committed:
            assert held.lease.step in self.commits, "a first completion was not committed"
            self.counts["duplicate_completion"] += 1
            return False
        if held.lease.step in self.commits:
            self.duplicate_commits += 1
        assert held.lease.step not in self.commits, "P2: a step committed twice"
        self.commits[held.lease.step] = held.lease.lease_id
        return True

    def timeout(self, held: Held) -> None:
        assert self.desk.expire(held.lease) is (held.state is LeaseState.LIVE)
        if held.state is LeaseState.LIVE:
            held.state = LeaseState.EXPIRED
            self.generation += 1
            self.counts["expired"] += 1

    def release(self, held: Held) -> None:
        holding = held.state in HOLDING
        assert self.desk.release(held.lease) is holding, "capacity not returned exactly once"
        if holding:
            held.state = LeaseState.RELEASED
            self.counts["released"] += 1
        else:
            self.counts["double_release"] += 1

    def cancel(self, held: Held) -> None:
        assert self.desk.cancel(held.lease) is (held.state is LeaseState.LIVE)
        if held.state is LeaseState.LIVE:
            held.state = LeaseState.CANCEL_REQUESTED
            self.counts["cancelled"] += 1

    def check(self, stats: dict[str, int]) -> None:
        """Every count of the desk equals the model's."""
        assert 0 <= stats["in_flight"] <= self.bound, "P1: in_flight left [0, bound]"
        assert stats["in_flight"] == len(self.holding())
        assert stats["generation"] == self.generation
        assert stats["committed"] == len(self.commits)
        assert stats["waiting"] == 0
        for name in COUNTERS:
            assert stats[name] == self.counts[name], name
        assert stats["underflow_prevented"] == stats["stale_release"] == 0


def new_model(client: redis.Redis, bound: int) -> DeskModel:
    clock = FakeClock()
    eval_run = f"model-{uuid.uuid4().hex[:12]}"
    desk = AdmissionDesk(client, eval_run, bound, clock=clock, sleep=clock.sleep, poll_s=0.25)
    return DeskModel(desk, clock, bound)


def forget(client: redis.Redis, desk: AdmissionDesk) -> None:
    client.delete(*vars(desk.keys).values())


# -- any interleaving: a state machine over the real desk ----------------------------------

pick = st.integers(min_value=0, max_value=1 << 16)  # an index into the candidates


def choose(candidates: list[Held], index: int) -> Held:
    return candidates[index % len(candidates)]


class DeskMachine(RuleBasedStateMachine):
    """Rules are what workers do to one eval-run's desk; invariants are P1-P4 and I7."""

    client: redis.Redis  # set by the test on a subclass: the session's embedded Redis

    def __init__(self) -> None:
        super().__init__()
        self.model: DeskModel | None = None
        self._stats: dict[str, int] | None = None

    @property
    def m(self) -> DeskModel:
        assert self.model is not None
        return self.model

    def stats(self) -> dict[str, int]:
        """The desk's counts after the last rule, read once for all invariants."""
        if self._stats is None:
            self._stats = self.m.desk.stats()
        return self._stats

    def _did(self) -> None:
        self._stats = None

    def _any(self) -> bool:
        return bool(self.m.leases)

    @initialize(bound=st.integers(min_value=1, max_value=3))
    def open_desk(self, bound: int) -> None:
        self.model = new_model(self.client, bound)

    @rule(step_of=st.none() | pick, wait=st.booleans(), frees=st.none() | pick)
    def acquire(self, step_of: int | None, wait: bool, frees: int | None) -> None:
        """A request (a retry when it reuses a step) asks for capacity; waiting at the
        bound, another worker may give one back meanwhile."""
        step = None
        if step_of is not None and self.m.leases:
            step = choose(self.m.leases, step_of).lease.step
        holders = self.m.holding()
        freer = choose(holders, frees) if frees is not None and holders else None
        self.m.acquire(step, wait=wait, frees=freer)
        self._did()

    @precondition(_any)
    @rule(index=pick)
    def expire(self, index: int) -> None:
        """The local timeout fires (a second firing, or on a finished lease, is a no-op)."""
        self.m.timeout(choose(self.m.leases, index))
        self._did()

    @precondition(_any)
    @rule(index=pick)
    def apply(self, index: int) -> None:
        """A completion arrives for any lease: committed, duplicate or stale."""
        self.m.complete(choose(self.m.leases, index))
        self._did()

    @precondition(lambda self: bool(self.m.in_state(LeaseState.EXPIRED)))
    @rule(index=pick)
    def late_completion(self, index: int) -> None:
        """The body of a timed-out request arrives after all: always stale (P4)."""
        held = choose(self.m.in_state(LeaseState.EXPIRED), index)
        assert self.m.complete(held) is False
        self._did()

    @precondition(lambda self: bool(self.m.holding()))
    @rule(index=pick)
    def release(self, index: int) -> None:
        """The request is over: its capacity comes back."""
        self.m.release(choose(self.m.holding(), index))
        self._did()

    @precondition(lambda self: bool(self.m.in_state(LeaseState.RELEASED)))
    @rule(index=pick)
    def double_release(self, index: int) -> None:
        """A second release of a finished lease: refused, counted, no capacity returned."""
        self.m.release(choose(self.m.in_state(LeaseState.RELEASED), index))
        self._did()

    @precondition(_any)
    @rule(index=pick)
    def cancel(self, index: int) -> None:
        """The job no longer wants the answer; the capacity stays held until release."""
        self.m.cancel(choose(self.m.leases, index))
        self._did()

    @invariant()
    def in_flight_within_the_bound(self) -> None:
        if self.model is not None:
            stats = self.stats()
            assert 0 <= stats["in_flight"] <= self.m.bound, "P1: in_flight left [0, bound]"
            assert stats["in_flight"] == len(self.m.holding())

    @invariant()
    def at_most_one_commit_per_step(self) -> None:
        if self.model is not None:
            assert self.m.duplicate_commits == 0, "P2: a step committed twice"
            stored = self.client.hgetall(self.m.desk.keys.committed)
            assert {int(step): lease for step, lease in stored.items()} == self.m.commits

    @invariant()
    def stale_completions_are_refused(self) -> None:
        if self.model is not None:
            stats = self.stats()
            assert stats["stale_completion"] == self.m.counts["stale_completion"]
            assert stats["duplicate_completion"] == self.m.counts["duplicate_completion"]

    @invariant()
    def capacity_is_returned_once(self) -> None:
        if self.model is not None:
            stats = self.stats()
            assert stats["released"] == self.m.counts["released"]
            assert stats["double_release"] == self.m.counts["double_release"]
            assert stats["underflow_prevented"] == stats["stale_release"] == 0

    @invariant()
    def every_count_matches_the_model(self) -> None:
        if self.model is not None:
            self.m.check(self.stats())

    def teardown(self) -> None:
        if self.model is None:
            return
        try:
            for held in self.m.holding():  # drain: each lease gives its capacity back once
                self.m.release(held)
            self.m.check(self.m.desk.stats())
            assert self.m.desk.stats()["in_flight"] == 0
        finally:
            forget(self.client, self.m.desk)


# Within the 200-seed model's budget (200 x 60 steps, ~5 s), the same on every run: no
# random seed, no example database.
MACHINE_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_any_interleaving_keeps_p1_to_p4(redis_client: redis.Redis) -> None:
    """Acquire, wait, timeout, late body, duplicates, double release, cancel: P1-P4, I7."""

    class OnTheSessionRedis(DeskMachine):
        client = redis_client

    run_state_machine_as_test(OnTheSessionRedis, settings=MACHINE_SETTINGS)


# -- the measure: duplicate commits per 100 timeout/late-completion pairs ------------------


def test_no_duplicate_commit_per_100_timeout_late_completion_pairs(
    redis_client: redis.Redis, record_property: Callable[[str, object], None]
) -> None:
    """100 injected timeout-then-late-completion pairs (with retries) give 0 duplicate commits."""
    rng = random.Random(20250304)
    model = new_model(redis_client, bound=rng.randint(1, 3))
    try:
        while model.pairs < 100:
            live = model.in_state(LeaseState.LIVE)
            if not live or rng.random() < 0.3:
                holders = model.holding()
                if len(holders) >= model.bound:
                    model.release(rng.choice(holders))
                model.acquire(None, wait=False)
                continue
            held = rng.choice(live)
            model.timeout(held)  # the local timer fires; the request is still out
            holders = model.holding()
            frees = rng.choice(holders) if rng.random() < 0.5 else None
            retry = model.acquire(held.lease.step, wait=True, frees=frees)
            order = [held, retry] if rng.random() < 0.5 else [retry, held]
            for late_or_retry in order:
                if late_or_retry is not None:
                    model.complete(late_or_retry)  # the original's body arrives late
                    model.release(late_or_retry)
            model.check(model.desk.stats())
    finally:
        forget(redis_client, model.desk)
    rate = 100 * model.duplicate_commits / model.pairs
    record_property("duplicate_commits_per_100_pairs", rate)
    print(
        f"duplicate commits per 100 timeout/late-completion pairs: {rate:g} "
        f"({model.duplicate_commits} of {model.pairs} pairs)"
    )
    assert (model.pairs, model.duplicate_commits) == (100, 0)
    assert model.counts["stale_completion"] >= 100
