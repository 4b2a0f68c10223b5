"""Enqueue jobs: a validating convenience over plain Celery."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from pydantic import ValidationError

from runner.core import keys
from runner.core.poll import PollTimeout, poll_until
from runner.errors import RunnerError
from runner.jobs import entry
from runner.jobs.entry import EntryError
from runner.jobs.models import JobResult, JobSpec, PythonPlanner
from runner.jobs.queue import QUEUE, TASK_NAME
from runner.jobs.results import load_result


class SpecError(RunnerError, ValueError):
    """A job spec that cannot run; the message names the fields."""


def parse_spec(data: Any) -> JobSpec:
    try:
        job = JobSpec.model_validate(data).with_job_id()
    except ValidationError as exc:
        raise SpecError(spec_problems(exc)) from None
    check_entry(job)
    return job


def spec_problems(exc: ValidationError) -> str:
    """``invalid job spec: <field>: <problem>; ...``, the first eight problems."""
    problems = []
    for err in exc.errors()[:8]:
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "invalid job spec: " + "; ".join(problems)


def check_entry(job: JobSpec) -> None:
    """Refuse a ``python`` planner whose entry cannot run (``runner.jobs.entry``)."""
    if isinstance(job.planner, PythonPlanner):
        try:
            entry.load(job.planner.entry)
        except EntryError as exc:
            raise SpecError(f"invalid job spec: {exc}") from None


def submit(app: Celery, client: redis.Redis, spec: JobSpec | dict[str, Any]) -> JobSpec:
    """Validate, record and enqueue one job; returns the spec with its job id."""
    job = spec if isinstance(spec, JobSpec) else parse_spec(spec)
    if isinstance(spec, JobSpec):
        check_entry(job)
    job = job.with_job_id()
    assert job.job_id is not None
    payload = job.model_dump(mode="json")
    client.set(keys.job_spec(job.job_id), json.dumps(payload))
    client.set(keys.job_state(job.job_id), "queued")
    client.zadd(keys.JOBS, {job.job_id: time.time()})
    app.send_task(TASK_NAME, args=[payload], queue=QUEUE)
    return job


def wait_for(
    client: redis.Redis,
    job_ids: list[str],
    timeout_s: float,
    on_progress: Callable[[dict[str, JobResult]], None] | None = None,
    poll_s: float = 0.2,
) -> dict[str, JobResult]:
    """Results of the given jobs, as they come in, until all are done or time runs out."""
    done: dict[str, JobResult] = {}

    def all_done() -> bool:
        for job_id in job_ids:
            if job_id not in done:
                result = load_result(client, job_id)
                if result is not None:
                    done[job_id] = result
        if on_progress is not None:
            on_progress(done)
        return len(done) == len(job_ids)

    with contextlib.suppress(PollTimeout):  # what came in by then is the answer
        poll_until(all_done, timeout_s, poll_s, what="every result")
    return done
