"""The tool-call envelope and the pure verdict over it (invariant I1).

A mutating call applies only when its envelope's (slot_id, generation, job_id,
attempt) equals the slot's current stamp and the lease has not expired. The checks
run in a fixed order so the same bad envelope always gets the same reason: the job
first (a foreign envelope), then the generation and attempt (an older lease of the
same job), then the slot's state and lease expiry, then the idempotency key.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from runner.core.ids import JobId
from runner.core.stamp import SlotState, Stamp
from tools.reasons import Reason

KEY_MAX_CHARS = 256


class Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: JobId
    attempt: int = Field(ge=1)
    slot_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=1)
    tool: str = Field(min_length=1, max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=KEY_MAX_CHARS)


def verdict(
    stamp: Stamp,
    *,
    job_id: str,
    generation: int,
    attempt: int | None,
    idempotency_key: str | None,
    mutating: bool,
    now: datetime,
) -> Reason | None:
    """None when the call may proceed; otherwise the reason it is refused."""
    if stamp.job_id != job_id:
        return Reason.SLOT_JOB_MISMATCH
    if stamp.generation != generation:
        return Reason.STALE_GENERATION
    # A superseded attempt of the same job holds a fenced-off lease: it is as stale
    # as an older generation.
    if attempt is not None and stamp.attempt is not None and stamp.attempt != attempt:
        return Reason.STALE_GENERATION
    if stamp.state == SlotState.POISONED:
        return Reason.SLOT_POISONED
    if not stamp.holds_lease():
        return Reason.LEASE_EXPIRED
    if stamp.is_expired(now):
        return Reason.LEASE_EXPIRED
    if mutating and not idempotency_key:
        return Reason.MISSING_IDEMPOTENCY_KEY
    return None


def check(stamp: Stamp, envelope: Envelope, *, mutating: bool, now: datetime) -> Reason | None:
    return verdict(
        stamp,
        job_id=envelope.job_id,
        generation=envelope.generation,
        attempt=envelope.attempt,
        idempotency_key=envelope.idempotency_key,
        mutating=mutating,
        now=now,
    )
