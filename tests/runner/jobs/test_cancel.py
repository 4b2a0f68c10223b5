"""runner.jobs.cancel against a real Redis: one script decides, in order with claim and commit."""

from __future__ import annotations

import uuid

import redis

from runner.core import keys
from runner.jobs.cancel import CancelOutcome, cancel
from runner.jobs.config import JobConfig
from runner.jobs.models import JobResult
from runner.jobs.results import commit_result, load_result
from runner.worker.liveness import Claimed, Finished, Liveness


def queued(client: redis.Redis) -> str:
    job = f"cx-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_state(job), "queued")
    client.zadd(keys.JOBS, {job: 1.0})
    return job


def test_unknown_job_changes_nothing(redis_client: redis.Redis) -> None:
    """A job id Redis has never seen is reported unknown and no key is written."""
    job = f"cx-{uuid.uuid4().hex[:8]}"
    report = cancel(redis_client, job)
    assert report.outcome == CancelOutcome.UNKNOWN_JOB and report.message() == f"{job}: unknown job"
    assert not redis_client.exists(keys.job_cancel(job), keys.job_result(job))


def test_not_started_job_is_cancelled_at_once(redis_client: redis.Redis) -> None:
    """A queued job gets its 'cancelled' result (attempt 0) and its delivery claims nothing."""
    job = queued(redis_client)
    report = cancel(redis_client, job)
    assert report.outcome == CancelOutcome.CANCELLED and not report.repeated
    result = load_result(redis_client, job)
    assert result is not None and result.state == "cancelled" and result.attempt == 0
    assert redis_client.get(keys.job_state(job)) == "cancelled"
    assert isinstance(Liveness(redis_client, job, JobConfig()).claim(), Finished)
    again = cancel(redis_client, job)
    assert again.outcome == CancelOutcome.ALREADY_FINISHED and again.state == "cancelled"
    assert again.message() == f"{job}: already finished: cancelled"


def test_running_job_gets_a_request_once(redis_client: redis.Redis) -> None:
    """A started job gets the cancel key; a second request is reported as a repeat."""
    job = queued(redis_client)
    claimed = Liveness(redis_client, job, JobConfig()).claim()
    assert isinstance(claimed, Claimed)
    first = cancel(redis_client, job, clock=lambda: 10.0)
    second = cancel(redis_client, job, clock=lambda: 20.0)
    assert first.outcome == second.outcome == CancelOutcome.CANCEL_REQUESTED
    assert (first.repeated, second.repeated) == (False, True)
    assert redis_client.get(keys.job_cancel(job)) == "10.0"  # the first request stands
    assert load_result(redis_client, job) is None
    assert "cancel requested" in first.message()


def test_cancel_after_the_commit_reports_the_state(redis_client: redis.Redis) -> None:
    """Exactly one terminal state: a cancel after the commit changes nothing."""
    job = queued(redis_client)
    Liveness(redis_client, job, JobConfig()).claim()
    assert commit_result(redis_client, JobResult(job_id=job, state="succeeded", attempt=1))
    report = cancel(redis_client, job)
    assert report.outcome == CancelOutcome.ALREADY_FINISHED and report.state == "succeeded"
    assert report.as_dict() == {
        "job_id": job,
        "outcome": "already_finished",
        "state": "succeeded",
        "repeated": False,
    }
    assert not redis_client.exists(keys.job_cancel(job))


def test_commit_after_a_not_started_cancel_is_refused(redis_client: redis.Redis) -> None:
    """The cancel's own commit and an attempt's commit never both land."""
    job = queued(redis_client)
    cancel(redis_client, job)
    assert not commit_result(redis_client, JobResult(job_id=job, state="succeeded", attempt=0))
    result = load_result(redis_client, job)
    assert result is not None and result.state == "cancelled"
