"""The tool-call envelope and the pure verdict over it (invariant I1).

A mutating call applies only when its envelope's (slot_id, generation, job_id,
attempt) equals the slot's current stamp and the lease has not expired. The checks
run in a fixed order so the same bad envelope always gets the same reason: the job
first (a foreign envelope), then the generation and attempt (an older lease of the
same job), then the slot's state and lease expiry, then the idempotency key and
the receipt it may already have.

:func:`verdict` is that decision, and the only one: plain values in, a reason (or
None) out, no I/O. The tool server calls it under the slot lock
(``tools.server.service``), the ``check_apply_envelope`` CLI calls it
(``hooks/check_apply_envelope.py``), and the client calls it before sending
(:func:`check`). Each caller reads the stamp and the key's receipt itself and passes
what it found.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from runner.core.ids import JOB_ID_RULE, JobId, valid_job_id
from runner.core.stamp import SlotState, Stamp
from tools import registry
from tools.errors import ToolError
from tools.reasons import Reason

KEY_MAX_CHARS = 256


def _integral(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as JSON Schema has it: 3 or 3.0, never true or "3" (the published schema
# says "integer", and a body decoded from JSON is validated in strict mode).
Whole = Annotated[int, Strict(), BeforeValidator(_integral)]


class Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: JobId
    attempt: Whole = Field(ge=1)
    slot_id: str = Field(min_length=1, max_length=64)
    generation: Whole = Field(ge=1)
    tool: str = Field(min_length=1, max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=KEY_MAX_CHARS)


class MalformedRequest(ToolError):
    """The request is not a JSON object with the envelope's fields."""

    reason = Reason.MALFORMED


@dataclass(frozen=True)
class Request:
    """A request's envelope fields as the hook CLI reads them; ``attempt`` and
    ``slot_id`` are checked only when given (a hook request may carry neither)."""

    job_id: str
    generation: int
    tool: str
    attempt: int | None = None
    slot_id: str | None = None
    idempotency_key: str | None = None


def parse_request(raw: object) -> Request:
    """The envelope fields of a decoded JSON request; :class:`MalformedRequest` naming
    the first field that is missing or of the wrong type."""
    if not isinstance(raw, dict):
        raise MalformedRequest("the request must be a JSON object")
    missing = [name for name in ("job_id", "generation", "tool") if name not in raw]
    if missing:
        raise MalformedRequest(f"the request lacks {', '.join(missing)}")
    job_id, generation, tool = raw["job_id"], raw["generation"], raw["tool"]
    attempt, key = raw.get("attempt"), raw.get("idempotency_key")
    if not valid_job_id(job_id):
        raise MalformedRequest(f"job_id must be {JOB_ID_RULE}")
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise MalformedRequest("generation must be an integer")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        raise MalformedRequest("attempt must be an integer")
    if not isinstance(tool, str) or not tool:
        raise MalformedRequest("tool must be a non-empty string")
    if key is not None and not isinstance(key, str):
        raise MalformedRequest("idempotency_key must be a string")
    slot_id = raw.get("slot_id")
    if "slot_id" in raw and not isinstance(slot_id, str):
        slot_id = ""  # given, but names no slot: never the stamp's (a mismatch, not malformed)
    return Request(job_id, generation, tool, attempt, slot_id, key)


def is_mutating(tool: str) -> bool:
    """Whether a call of ``tool`` changes the tree; an unknown tool fails closed (yes)."""
    spec = registry.get(tool)
    return spec.mutating if spec is not None else True


def verdict(
    stamp: Stamp,
    *,
    job_id: str,
    generation: int,
    attempt: int | None,
    idempotency_key: str | None,
    mutating: bool,
    now: datetime,
    slot_id: str | None = None,
    key_holder: str | None = None,
) -> Reason | None:
    """None when the call may proceed; otherwise the reason it is refused.

    ``slot_id`` is compared with the stamp's when given. ``key_holder`` is the job
    that the key's receipt (of any status) already names, None when the key has no
    receipt: a key is bound to its first job forever (I2).
    """
    if slot_id is not None and slot_id != stamp.slot_id:
        return Reason.SLOT_JOB_MISMATCH
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
    if idempotency_key and key_holder is not None and key_holder != job_id:
        return Reason.KEY_BOUND_TO_OTHER_JOB
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
