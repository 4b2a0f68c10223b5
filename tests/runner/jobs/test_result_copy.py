"""A committed result survives a Redis restarted empty: the job is not run again (I5's twin).

These tests restart their own embedded Redis with no data, never the session one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs import result_copy
from runner.jobs.config import JobConfig
from runner.jobs.models import JobResult
from runner.jobs.results import finish, load_result
from runner.redis_server import EmbeddedRedis
from runner.worker.liveness import Claimed, Finished, Liveness

JOB = "job-kept"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis(tmp_path / "r")
    embedded.ensure()
    yield embedded
    embedded.leave()


@pytest.fixture
def settings(tmp_path: Path, server: EmbeddedRedis) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    url = server.ensure()
    return Settings.from_env({"SLOTRUNNER_HOME": str(home), "REDIS_URL": url})


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(str(settings.redis_url), decode_responses=True)
    yield conn
    conn.close()


def _run_once(client: redis.Redis, settings: Settings, home: Path | None) -> JobResult:
    """Claim, then commit a result as the attempt would (with or without a local copy)."""
    liveness = Liveness(client, JOB, JobConfig(), home=settings.home)
    claimed = liveness.claim()
    assert isinstance(claimed, Claimed), claimed
    result = JobResult(job_id=JOB, state="succeeded", attempt=claimed.attempt, final_tree="t1")
    finish(client, EventLog(settings), result, home=home)
    liveness.end(claimed.attempt)
    return result


def test_a_wipe_after_the_commit_leaves_the_job_finished_and_puts_the_result_back(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis
) -> None:
    committed = _run_once(client, settings, home=settings.home)
    assert result_copy.load(settings.home, JOB) == committed

    server.restart(wipe=True)
    assert load_result(client, JOB) is None  # Redis lost it

    # A delivery still held by a worker claims the job again: it is finished.
    assert isinstance(Liveness(client, JOB, JobConfig(), home=settings.home).claim(), Finished)
    assert load_result(client, JOB) == committed
    assert int(client.get(keys.job_attempt(JOB)) or 0) == committed.attempt


def test_without_the_copy_the_wiped_job_would_run_again(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis
) -> None:
    """The same wipe with no kept copy: the claim starts a new attempt (what the copy stops)."""
    _run_once(client, settings, home=None)
    server.restart(wipe=True)
    again = Liveness(client, JOB, JobConfig(), home=settings.home).claim()
    assert isinstance(again, Claimed) and again.attempt > 1  # above the lost attempt 1


def test_republish_never_overwrites_a_result_in_redis(
    client: redis.Redis, settings: Settings
) -> None:
    committed = _run_once(client, settings, home=settings.home)
    other = committed.model_copy(update={"final_tree": "other"})
    assert result_copy.republish(client, other) is False
    assert load_result(client, JOB) == committed


def test_a_bad_copy_is_an_error_not_a_result(settings: Settings) -> None:
    path = result_copy.copy_path(settings.home, JOB)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(result_copy.ResultCopyError, match="does not hold a job result"):
        result_copy.load(settings.home, JOB)
    path.write_text(JobResult(job_id="someone-else", state="failed", attempt=1).model_dump_json())
    with pytest.raises(result_copy.ResultCopyError, match="someone-else"):
        result_copy.load(settings.home, JOB)
    with pytest.raises(result_copy.ResultCopyError, match=r"job id '\.\./escape' is not valid"):
        result_copy.copy_path(settings.home, "../escape")


def test_an_unusable_copy_lets_the_job_be_claimed(client: redis.Redis, settings: Settings) -> None:
    """Fail open on purpose: a rerun costs work, never a second apply (own keys, own slot)."""
    path = result_copy.copy_path(settings.home, JOB)
    path.parent.mkdir(parents=True)
    path.write_text("garbage")
    assert isinstance(Liveness(client, JOB, JobConfig(), home=settings.home).claim(), Claimed)
