"""Backpressure: a job that cannot get a slot, or time, in time is refused, and counted.

Nothing waits forever. A job waits for a slot at most ``SLOTRUNNER_SLOT_WAIT_S`` and
never so long that less than the minimum of its deadline would be left; past that it
ends ``rejected`` with reason ``no_slot``. A job whose deadline (counted from its
submission, not from when a worker got to it) leaves less than
``SLOTRUNNER_MIN_DEADLINE_S`` is not started: ``rejected`` with reason ``deadline``.
Each rejection bumps ``slotrunner:rejected`` (``runner.core.keys``) in the same script
that commits the result, so a redelivered copy never counts twice.
"""

from __future__ import annotations

import redis

from runner.core import keys

NO_SLOT = "no_slot"
DEADLINE = "deadline"
REASONS = (NO_SLOT, DEADLINE)


def deadline_left_s(deadline_s: float, submitted_at: float, now: float) -> float:
    """Seconds of the job's deadline left at ``now`` (epoch seconds on both sides)."""
    return deadline_s - max(0.0, now - submitted_at)


def too_late(left_s: float, min_deadline_s: float) -> bool:
    """True when so little is left that starting the job would waste a slot."""
    return left_s < min_deadline_s


def slot_wait_s(slot_wait_s: float, left_s: float, min_deadline_s: float) -> float:
    """How long to wait for a slot: bounded, and leaving the minimum deadline to work in."""
    return max(0.0, min(slot_wait_s, left_s - min_deadline_s))


def reason_code(reason: str | None) -> str | None:
    """The counter a rejection reason belongs to ("no_slot: all 2 slots..." -> "no_slot")."""
    if reason is None:
        return None
    code = reason.split(":", 1)[0].strip()
    return code if code in REASONS else None


def rejection_counts(client: redis.Redis) -> dict[str, int]:
    """Jobs rejected so far, by reason (every reason listed, zero when none)."""
    raw = client.hgetall(keys.REJECTED)
    counts = {reason: 0 for reason in REASONS}
    for name, value in raw.items():
        counts[str(name)] = int(value)
    return counts
