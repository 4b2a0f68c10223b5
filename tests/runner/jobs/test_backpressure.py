"""Backpressure decisions (pure) and the rejection counter (real Redis)."""

from __future__ import annotations

import uuid

import pytest
import redis

from runner.core import keys
from runner.core.settings import SettingsError
from runner.core.stamp import Stamp, iso, utc_now
from runner.jobs.backpressure import (
    deadline_left_s,
    reason_code,
    rejection_counts,
    slot_wait_s,
    too_late,
)
from runner.jobs.models import JobResult
from runner.jobs.results import commit_result
from runner.slots.lease_keeper import renewal_due
from runner.worker.celery_app import broker_transport_options


def test_deadline_counts_from_submission() -> None:
    """Time spent queued is taken off the deadline; a clock skewed backwards adds nothing."""
    assert deadline_left_s(60, submitted_at=1000, now=1045) == 15
    assert deadline_left_s(60, submitted_at=1000, now=990) == 60


@pytest.mark.parametrize(
    ("left", "minimum", "late"), [(4.9, 5, True), (5, 5, False), (-3, 0, True)]
)
def test_too_late(left: float, minimum: float, late: bool) -> None:
    """A job with less than the minimum left is not started."""
    assert too_late(left, minimum) is late


def test_slot_wait_is_bounded_and_leaves_time_to_work() -> None:
    """The wait is the smaller of the configured bound and what the deadline can spare."""
    assert slot_wait_s(30, left_s=600, min_deadline_s=5) == 30
    assert slot_wait_s(30, left_s=12, min_deadline_s=5) == 7
    assert slot_wait_s(30, left_s=3, min_deadline_s=5) == 0


def test_reason_codes() -> None:
    """Only the documented reasons are counted."""
    assert reason_code("no_slot: all 1 slots stayed busy for 1.0s") == "no_slot"
    assert reason_code("deadline: 1.0s left") == "deadline"
    assert reason_code("tests failed") is None and reason_code(None) is None


def test_a_rejection_is_counted_once(redis_client: redis.Redis) -> None:
    """The counter moves in the commit script, so a second copy's commit counts nothing."""
    job = f"bp-{uuid.uuid4().hex[:8]}"
    redis_client.set(keys.job_attempt(job), 1)
    before = rejection_counts(redis_client)["no_slot"]
    rejected = JobResult(job_id=job, state="rejected", attempt=1, reason="no_slot: busy")
    assert commit_result(redis_client, rejected, counter="no_slot")
    assert not commit_result(redis_client, rejected, counter="no_slot")
    assert rejection_counts(redis_client)["no_slot"] == before + 1


def test_broker_options_come_from_the_environment() -> None:
    """Visibility timeout defaults to minutes; no test switch in the environment is read."""
    assert broker_transport_options({}) == {"visibility_timeout": 300.0}
    assert broker_transport_options(
        {"SLOTRUNNER_VISIBILITY_TIMEOUT_S": "3", "SLOTRUNNER_TEST_UNACKED_RESTORE_S": "0.5"}
    ) == {"visibility_timeout": 3.0}
    with pytest.raises(SettingsError, match="SLOTRUNNER_VISIBILITY_TIMEOUT_S"):
        broker_transport_options({"SLOTRUNNER_VISIBILITY_TIMEOUT_S": "0"})


def test_lease_renewal_is_due_at_half_life() -> None:
    """A lease is renewed once less than half its TTL is left."""
    now = utc_now()
    from datetime import timedelta

    def lease(left_s: float) -> Stamp:
        return Stamp(
            slot_id="S0",
            host="h",
            generation=1,
            lease_expires_at=iso(now + timedelta(seconds=left_s)),
        )

    assert not renewal_due(lease(40), now, ttl_s=60)
    assert renewal_due(lease(20), now, ttl_s=60)
    assert renewal_due(lease(-1), now, ttl_s=60)
