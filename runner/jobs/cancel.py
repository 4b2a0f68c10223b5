"""Cancel a job (docs/architecture.md §I7): a request, then the job's own confirmed release.

:func:`cancel` runs one Lua script, so it serialises with the attempt claim
(``runner.worker.liveness``) and the result commit (``runner.worker.job``):

* the result is committed          -> ``already_finished`` (its state is reported;
                                       nothing changes: a job has one terminal state);
* nothing of the job is known      -> ``unknown_job``;
* otherwise ``job:{id}:cancel`` is set (NX: a repeated cancel is reported as such and
  changes nothing), and
  * no attempt ever started        -> the ``cancelled`` result is committed now
                                       (attempt 0): the delivery, whenever it comes,
                                       finds the result and leases nothing;
  * an attempt started             -> ``cancel_requested``: the running attempt sees it
                                       between steps (its in-flight call finishes),
                                       marks its slot ``cancel_requested`` (capacity
                                       stays counted), snapshots, releases the slot,
                                       and commits ``cancelled``. A later attempt of
                                       the job sees it before leasing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import redis

from runner.core import keys
from runner.jobs.models import JobResult

# KEYS: result, attempt, cancel, state, spec, jobs   ARGV: job_id, now, cancelled_result
_CANCEL = """
local state = redis.call('GET', KEYS[4])
if redis.call('EXISTS', KEYS[1]) == 1 then return {'already_finished', state or '', 0} end
local known = redis.call('EXISTS', KEYS[2], KEYS[4], KEYS[5]) > 0
if not known and not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
  return {'unknown_job', '', 0}
end
local repeated = 1
if redis.call('SET', KEYS[3], ARGV[2], 'NX') then repeated = 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[3])
  redis.call('SET', KEYS[4], 'cancelled')
  return {'cancelled', 'cancelled', repeated}
end
return {'cancel_requested', state or '', repeated}
"""

NOT_STARTED_REASON = "cancelled before it started"


class CancelOutcome(StrEnum):
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"
    UNKNOWN_JOB = "unknown_job"


@dataclass(frozen=True)
class CancelReport:
    job_id: str
    outcome: CancelOutcome
    state: str | None  # the job's state after the request (queued, running, <terminal>)
    repeated: bool  # a cancel had been requested before this one

    def message(self) -> str:
        if self.outcome == CancelOutcome.ALREADY_FINISHED:
            return f"{self.job_id}: already finished: {self.state}"
        if self.outcome == CancelOutcome.CANCELLED:
            return f"{self.job_id}: cancelled before it started"
        if self.outcome == CancelOutcome.UNKNOWN_JOB:
            return f"{self.job_id}: unknown job"
        if self.repeated:
            return f"{self.job_id}: cancel requested (again; the first request stands)"
        return f"{self.job_id}: cancel requested (it stops before its next step)"

    def as_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "outcome": self.outcome.value,
            "state": self.state,
            "repeated": self.repeated,
        }


def cancel(
    client: redis.Redis, job_id: str, clock: Callable[[], float] = time.time
) -> CancelReport:
    """Request the cancel of ``job_id``; idempotent. See the module docstring."""
    not_started = JobResult(job_id=job_id, state="cancelled", attempt=0, reason=NOT_STARTED_REASON)
    script = client.register_script(_CANCEL)
    outcome, state, repeated = script(
        keys=[
            keys.job_result(job_id),
            keys.job_attempt(job_id),
            keys.job_cancel(job_id),
            keys.job_state(job_id),
            keys.job_spec(job_id),
            keys.JOBS,
        ],
        args=[job_id, repr(clock()), not_started.model_dump_json()],
    )
    return CancelReport(job_id, CancelOutcome(outcome), state or None, bool(int(repeated)))
