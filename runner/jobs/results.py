"""A job's result in Redis: committed once, by the job's current attempt only.

Also the ``job_finished`` log line, and the rejection counter of
``runner.jobs.backpressure``, both moved by the same commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from runner.core import events, keys
from runner.core.logs import EventLog
from runner.jobs import result_copy
from runner.jobs.models import JobResult

# Commit the result only when the caller is still the job's current attempt and no
# result exists yet: a superseded attempt can finish its work but never its result.
# A rejection is counted here, in the same script, so it counts once per job.
_COMMIT = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], ARGV[3])
if ARGV[4] ~= '' then redis.call('HINCRBY', KEYS[4], ARGV[4], 1) end
return 1
"""


def commit_result(client: redis.Redis, result: JobResult, counter: str | None = None) -> bool:
    """True when this commit is the job's one result (see ``_COMMIT``)."""
    script = client.register_script(_COMMIT)
    committed = script(
        keys=[
            keys.job_attempt(result.job_id),
            keys.job_result(result.job_id),
            keys.job_state(result.job_id),
            keys.REJECTED,
        ],
        args=[result.attempt, result.model_dump_json(), result.state, counter or ""],
    )
    return bool(committed == 1)


def finish(
    client: redis.Redis,
    log: EventLog,
    result: JobResult,
    counter: str | None = None,
    *,
    home: Path | None = None,
) -> JobResult:
    """Commit (if still current) and log ``job_finished`` with whether it committed.

    With ``home``, a committed result is also kept on this host
    (``runner.jobs.result_copy``), so a Redis that loses it does not make the job run again.
    """
    committed = commit_result(client, result, counter)
    log.emit(
        events.JOB_FINISHED,
        job_id=result.job_id,
        attempt=result.attempt,
        state=result.state,
        committed=committed,
        reason=result.reason,
    )
    if committed and home is not None:
        try:
            result_copy.keep(home, result)
        except (OSError, result_copy.ResultCopyError) as exc:
            # The commit stands; only a Redis wipe before the next delivery would
            # now run the job again (see runner.jobs.result_copy).
            log.emit(
                events.JOB_RESULT_NOT_KEPT,
                job_id=result.job_id,
                attempt=result.attempt,
                error=f"{type(exc).__name__}: {exc}",
            )
    return result


def load_result(client: redis.Redis, job_id: str) -> JobResult | None:
    raw = client.get(keys.job_result(job_id))
    if raw is None:
        return None
    return JobResult.model_validate(json.loads(raw))
