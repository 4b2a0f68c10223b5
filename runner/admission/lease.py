"""What the admission desk hands out and refuses: a lease, its keys, and its errors.

A :class:`Lease` is capacity held for one inference request of one planner step,
granted by the desk of one eval-run (``runner/admission/desk.py``) in one epoch of it.
The desk's Redis keys (``E`` is the eval-run; the ``{E}`` hash tag keeps one desk in
one cluster slot, so every script touches a single slot):

    admission:{E}:desk       HASH  bound, epoch, in_flight, generation, ticket,
                                   created_ms and recovering_until_ms (server clock),
                                   and the counters acquired, refused, expired,
                                   cancelled, released, stale_completion,
                                   duplicate_completion, double_release,
                                   stale_release, adopted, underflow_prevented,
                                   recoveries
    admission:{E}:leases     HASH  lease id -> JSON {state, generation, step, epoch};
                                   released leases stay, so a second release is
                                   recognised as one
    admission:{E}:committed  HASH  step -> lease id of the one completion committed
    admission:{E}:waiting    ZSET  "<expiry_ms>:<lease id>" scored by arrival ticket:
                                   the bounded FIFO of callers waiting for capacity
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from runner.admission.table import LeaseState
from runner.errors import RunnerError


class RefusalReason(StrEnum):
    BOUND = "bound"  # at the bound and the caller may not wait
    QUEUE_FULL = "queue_full"  # at the bound and max_waiting callers already wait
    DEADLINE = "deadline"  # waited until the deadline without getting capacity
    RECOVERING = "recovering"  # the desk was lost and re-created: no grant until the hold ends
    NO_WITNESS = "no_witness"  # this host cannot record the epoch it was granted in


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


class AdmissionError(RunnerError):
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
