"""A host's durable copy of every job result it committed: results a Redis wipe cannot take.

``slotrunner:job:{id}:result`` lives only in Redis. When Redis restarts without its
data, a delivery still held by a worker (a watchdog copy, a requeued message) finds
no result and no heartbeat, claims the next attempt and runs the finished job again,
committing a second result. The attempt floor (``runner.worker.attempt_floor``) already
keeps the attempt numbers growing; this keeps the job finished. After its commit,
the attempt writes the result to::

    $SLOTRUNNER_HOME/results/<job_id>.json     the JobResult as committed

and a claim on this host (``runner.worker.liveness``, under the attempt floor's lock) that
finds the file puts the result back into Redis (only if none is there) and reports
the job finished. Per host, like the floor: a delivery on a host that never ran the
job cannot know. A copy that cannot be read is reported and ignored -- the job may
then run again, which costs work but applies nothing twice (every attempt has its
own keys and slot).

Across hosts, :func:`republish_all` (``slotrunner republish``) closes what a claim cannot
see: run on every host after Redis lost its data and before jobs without a result are
submitted again, it puts back every result the host kept, so a job committed on one
host is not run again on another (docs/architecture.md §Host records).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis
from pydantic import ValidationError

from runner.core import keys
from runner.core.durable import ensure_dir, replace_file
from runner.core.ids import JobIdError, check_job_id
from runner.errors import RunnerError
from runner.jobs.models import JobResult

RESULTS_DIR = "results"

# KEYS: result, state, attempt   ARGV: result json, state, attempt
# Put a kept result back; never over one that is there. The attempt counter is raised
# to the result's attempt so a stray older attempt stays fenced.
_REPUBLISH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[3]) then
  redis.call('SET', KEYS[3], ARGV[3])
end
return 1
"""


class ResultCopyError(RunnerError):
    """The kept copy of a result cannot be read or parsed."""


def copy_path(home: Path, job_id: str) -> Path:
    """``$SLOTRUNNER_HOME/results/<job_id>.json``; a bad job id is refused."""
    try:
        # The one job-id rule has no '/' and no '..': the name stays in RESULTS_DIR.
        name = check_job_id(job_id)
    except JobIdError as exc:
        raise ResultCopyError(str(exc)) from exc
    return home / RESULTS_DIR / f"{name}.json"


def keep(home: Path, result: JobResult) -> Path:
    """Write ``result`` durably (raises OSError; the commit itself already stands)."""
    path = copy_path(home, result.job_id)
    ensure_dir(path.parent)
    replace_file(path, result.model_dump_json().encode())
    return path


def load(home: Path, job_id: str) -> JobResult | None:
    """The kept result, None when this host never committed one; ResultCopyError if unusable."""
    path = copy_path(home, job_id)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ResultCopyError(f"cannot read {path}: {exc}") from exc
    try:
        result = JobResult.model_validate_json(raw)
    except ValidationError as exc:
        raise ResultCopyError(f"{path} does not hold a job result: {exc}") from exc
    if result.job_id != job_id:
        raise ResultCopyError(f"{path} holds the result of job {result.job_id!r}")
    return result


def republish(client: redis.Redis, result: JobResult) -> bool:
    """Put ``result`` back into Redis unless one is there; True when it was missing."""
    script = client.register_script(_REPUBLISH)
    done = script(
        keys=[
            keys.job_result(result.job_id),
            keys.job_state(result.job_id),
            keys.job_attempt(result.job_id),
        ],
        args=[result.model_dump_json(), result.state, result.attempt],
    )
    return bool(done == 1)


@dataclass
class Republished:
    """What :func:`republish_all` did, by job id."""

    put_back: list[str] = field(default_factory=list)  # missing from Redis, now there
    present: list[str] = field(default_factory=list)  # Redis had a result: left alone
    unusable: dict[str, str] = field(default_factory=dict)  # copy unreadable: why

    def as_dict(self) -> dict[str, object]:
        return {"put_back": self.put_back, "present": self.present, "unusable": self.unusable}


def republish_all(client: redis.Redis, home: Path) -> Republished:
    """Put every result kept under ``home`` back into Redis where none is there.

    A copy that cannot be read is reported, not raised: the others still go back.
    Raises ``redis.RedisError`` when Redis cannot be reached (nothing is half-done
    that a second run would not finish: each result goes back in one script).
    """
    client.ping()  # a wrong REDIS_URL is an error even on a host that kept nothing
    done = Republished()
    directory = home / RESULTS_DIR
    if not directory.is_dir():
        return done
    for path in sorted(directory.glob("*.json")):
        job_id = path.name.removesuffix(".json")
        try:
            kept = load(home, job_id)
        except ResultCopyError as exc:
            done.unusable[job_id] = str(exc)
            continue
        if kept is None:  # removed since the listing
            continue
        (done.put_back if republish(client, kept) else done.present).append(job_id)
    return done
