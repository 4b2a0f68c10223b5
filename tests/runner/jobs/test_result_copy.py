"""A committed result survives a Redis restarted empty: the job is not run again (I5's twin).

These tests restart their own embedded Redis with no data, never the session one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from runner.cli.main import main
from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs import result_copy
from runner.jobs.config import JobConfig
from runner.jobs.models import JobResult
from runner.jobs.results import finish, load_result
from runner.redis_server import EmbeddedRedis
from runner.worker.liveness import Claimed, Finished, Liveness
from tests.support.ports import refusing_port

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


def test_republish_all_stops_another_host_from_running_a_wiped_job_again(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis, tmp_path: Path
) -> None:
    """Host A committed; Redis lost it; the job is resubmitted and reaches host B, which
    never ran it. B's own claim cannot know (the limit per host); A's republish closes it."""
    committed = _run_once(client, settings, home=settings.home)
    host_b = tmp_path / "host-b"
    host_b.mkdir()
    server.restart(wipe=True)

    done = result_copy.republish_all(client, settings.home)
    assert (done.put_back, done.present, done.unusable) == ([JOB], [], {})
    assert isinstance(Liveness(client, JOB, JobConfig(), home=host_b).claim(), Finished)
    assert load_result(client, JOB) == committed

    again = result_copy.republish_all(client, settings.home)  # harmless to repeat
    assert (again.put_back, again.present) == ([], [JOB])


def test_republish_all_without_it_the_other_host_runs_the_job_again(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis, tmp_path: Path
) -> None:
    _run_once(client, settings, home=settings.home)
    host_b = tmp_path / "host-b"
    host_b.mkdir()
    server.restart(wipe=True)
    assert isinstance(Liveness(client, JOB, JobConfig(), home=host_b).claim(), Claimed)


def test_republish_all_names_an_unreadable_copy_and_puts_the_others_back(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis
) -> None:
    _run_once(client, settings, home=settings.home)
    bad = result_copy.copy_path(settings.home, "job-torn")
    bad.write_text("{torn")
    server.restart(wipe=True)
    done = result_copy.republish_all(client, settings.home)
    assert done.put_back == [JOB]
    assert list(done.unusable) == ["job-torn"]
    assert "does not hold a job result" in done.unusable["job-torn"]
    assert load_result(client, "job-torn") is None


def test_republish_all_on_a_host_that_kept_nothing(client: redis.Redis, tmp_path: Path) -> None:
    done = result_copy.republish_all(client, tmp_path / "never-used")
    assert (done.put_back, done.present, done.unusable) == ([], [], {})


def _cli(settings: Settings, *args: str) -> Result:
    env = {"SLOTRUNNER_HOME": str(settings.home), "REDIS_URL": str(settings.redis_url)}
    return CliRunner().invoke(main, ["republish", *args], env=env, prog_name="slotrunner")


def test_the_republish_verb_puts_results_back_and_says_which(
    client: redis.Redis, settings: Settings, server: EmbeddedRedis
) -> None:
    committed = _run_once(client, settings, home=settings.home)
    server.restart(wipe=True)
    shown = _cli(settings, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {
        "home": str(settings.home),
        "put_back": [JOB],
        "present": [],
        "unusable": {},
    }
    assert load_result(client, JOB) == committed
    again = _cli(settings)
    assert again.exit_code == 0
    assert again.stdout.startswith("0 result(s) put back, 1 already in Redis, 0 unreadable")


def test_the_republish_verb_exits_1_naming_an_unreadable_copy(
    client: redis.Redis, settings: Settings
) -> None:
    bad = result_copy.copy_path(settings.home, "job-torn")
    bad.parent.mkdir(parents=True)
    bad.write_text("{torn")
    shown = _cli(settings)
    assert shown.exit_code == 1
    assert "unreadable: job-torn:" in shown.stderr
    assert "Traceback" not in shown.output


def test_the_republish_verb_without_redis_is_one_error_line(settings: Settings) -> None:
    result_copy.keep(
        settings.home, JobResult(job_id=JOB, state="succeeded", attempt=1, final_tree="t")
    )
    with refusing_port() as port:
        gone = Settings.from_env(
            {"SLOTRUNNER_HOME": str(settings.home), "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        )
        shown = _cli(gone)
    assert shown.exit_code == 2, shown.output
    lines = [line for line in shown.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), shown.stderr
