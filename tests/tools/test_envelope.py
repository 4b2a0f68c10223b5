"""The envelope verdict: one pure decision over plain values, in a fixed order (I1, I2)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runner.core.stamp import SlotState, Stamp, iso, utc_now
from tools.envelope import MalformedRequest, Request, is_mutating, parse_request, verdict
from tools.reasons import Reason

NOW = utc_now()
STAMP = Stamp(
    slot_id="S1",
    host="h",
    generation=4,
    job_id="job-A",
    attempt=2,
    state=SlotState.LEASED,
    leased_at=iso(NOW),
    lease_expires_at=iso(NOW + timedelta(seconds=60)),
)


def decide(stamp: Stamp = STAMP, **fields: Any) -> Reason | None:
    call: dict[str, Any] = {
        "job_id": "job-A",
        "generation": 4,
        "attempt": 2,
        "idempotency_key": "job-A:k",
        "mutating": True,
        "now": NOW,
    }
    call.update(fields)
    return verdict(stamp, **call)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, None),
        ({"slot_id": "S1"}, None),
        ({"slot_id": "S2"}, Reason.SLOT_JOB_MISMATCH),
        ({"slot_id": "S2", "generation": 3}, Reason.SLOT_JOB_MISMATCH),  # the slot first
        ({"job_id": "job-B", "generation": 3}, Reason.SLOT_JOB_MISMATCH),  # then the job
        ({"generation": 5}, Reason.STALE_GENERATION),
        ({"attempt": 1}, Reason.STALE_GENERATION),
        ({"attempt": None}, None),
        ({"now": NOW + timedelta(seconds=61)}, Reason.LEASE_EXPIRED),
        ({"idempotency_key": None}, Reason.MISSING_IDEMPOTENCY_KEY),
        ({"idempotency_key": None, "mutating": False}, None),
        ({"key_holder": "job-A"}, None),
        ({"key_holder": "job-B"}, Reason.KEY_BOUND_TO_OTHER_JOB),
        # A stale envelope is refused as stale even when its key is someone else's.
        ({"key_holder": "job-B", "generation": 3}, Reason.STALE_GENERATION),
    ],
)
def test_verdict_names_the_first_rule_broken(fields: dict[str, Any], reason: Reason | None) -> None:
    """Each refusal has one reason, the same every time for the same inputs."""
    assert decide(**fields) is reason


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (SlotState.CANCEL_REQUESTED, None),
        (SlotState.POISONED, Reason.SLOT_POISONED),
        (SlotState.IDLE, Reason.LEASE_EXPIRED),
        (SlotState.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED),
    ],
)
def test_the_slot_state_decides_after_the_owner(state: SlotState, reason: Reason | None) -> None:
    """Only a held lease takes calls; a poisoned slot says so."""
    assert decide(STAMP.model_copy(update={"state": state})) is reason


def test_unknown_tools_are_mutating() -> None:
    """An unknown tool fails closed: it needs a key like any mutating tool."""
    assert is_mutating("write_file") and is_mutating("format_disk")
    assert not is_mutating("read_file")


def test_parse_request_reads_the_optional_fields() -> None:
    """attempt and slot_id are optional; a slot_id that is not a string names no slot."""
    assert parse_request({"job_id": "a", "generation": 1, "tool": "rm"}) == Request("a", 1, "rm")
    odd = parse_request({"job_id": "a", "generation": 1, "tool": "rm", "slot_id": None})
    assert odd.slot_id == ""
    assert decide(slot_id=odd.slot_id) is Reason.SLOT_JOB_MISMATCH


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ([], "JSON object"),
        ({"job_id": "a", "tool": "x"}, "generation"),
        ({"job_id": "a\n", "generation": 1, "tool": "x"}, "job_id"),
        ({"job_id": "a", "generation": True, "tool": "x"}, "generation"),
        ({"job_id": "a", "generation": 1, "tool": ""}, "tool"),
        ({"job_id": "a", "generation": 1, "tool": "x", "idempotency_key": 3}, "idempotency_key"),
    ],
)
def test_parse_request_names_the_bad_field(raw: object, needle: str) -> None:
    """A malformed request is refused naming its field, with the malformed reason."""
    with pytest.raises(MalformedRequest, match=needle) as err:
        parse_request(raw)
    assert err.value.reason is Reason.MALFORMED
