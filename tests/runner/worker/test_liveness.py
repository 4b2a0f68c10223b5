"""Job liveness against a real Redis: claim, heartbeat, watchdog, takeover, fence."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs.config import JobConfig
from runner.jobs.models import JobResult
from runner.jobs.results import commit_result
from runner.worker.liveness import (
    CANCELLED,
    SUPERSEDED,
    Claimed,
    Finished,
    Heartbeat,
    Live,
    Liveness,
    acquire,
)
from tests.support.stack import wait_until

SHORT = JobConfig(heartbeat_ttl_s=0.4, heartbeat_interval_s=0.1, watchdog_poll_s=0.05)


def new_job() -> str:
    return f"live-{uuid.uuid4().hex[:10]}"


def events(settings: Settings, name: str, job_id: str) -> list[dict[str, object]]:
    import json

    if not settings.log_path.exists():
        return []
    out = []
    for line in settings.log_path.read_text().splitlines():
        record = json.loads(line)
        if record["event"] == name and record.get("job_id") == job_id:
            out.append(record)
    return out


def test_first_claim_takes_attempt_one_and_a_live_heartbeat(redis_client: redis.Redis) -> None:
    """A claim INCRs the attempt and sets the heartbeat to it, with a TTL, in one step."""
    job = new_job()
    live = Liveness(redis_client, job, JobConfig())
    claimed = live.claim()
    assert isinstance(claimed, Claimed) and claimed.attempt == 1
    assert redis_client.get(keys.job_heartbeat(job)) == "1"
    assert 0 < redis_client.pttl(keys.job_heartbeat(job)) <= 5000
    assert redis_client.zscore(keys.JOBS, job) == pytest.approx(claimed.submitted_at)


def test_claim_while_live_reports_the_live_attempt(redis_client: redis.Redis) -> None:
    """A second claim while the heartbeat lives starts nothing: Live(attempt)."""
    job = new_job()
    live = Liveness(redis_client, job, JobConfig())
    live.claim()
    assert live.claim() == Live(1)
    assert redis_client.get(keys.job_attempt(job)) == "1"


def test_submit_time_is_kept_when_known(redis_client: redis.Redis) -> None:
    """A job's deadline counts from its submission, not from its first claim."""
    job = new_job()
    redis_client.zadd(keys.JOBS, {job: 1000.0})
    claimed = Liveness(redis_client, job, JobConfig()).claim()
    assert isinstance(claimed, Claimed) and claimed.submitted_at == 1000.0


def test_a_committed_result_means_finished(redis_client: redis.Redis) -> None:
    """Once the result is committed every claim answers Finished."""
    job = new_job()
    live = Liveness(redis_client, job, JobConfig())
    live.claim()
    assert commit_result(redis_client, JobResult(job_id=job, state="succeeded", attempt=1))
    live.end(1)
    assert isinstance(live.claim(), Finished)


def test_stale_heartbeat_lets_a_new_attempt_fence_the_old(redis_client: redis.Redis) -> None:
    """After the TTL a claim takes attempt 2; attempt 1 can neither beat nor commit."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()
    wait_until("the heartbeat to lapse", lambda: not redis_client.exists(keys.job_heartbeat(job)))
    second = live.claim()
    assert isinstance(second, Claimed) and second.attempt == 2
    assert live.beat(1) is False
    assert live.stop_reason(1) == SUPERSEDED and live.stop_reason(2) is None
    assert not commit_result(redis_client, JobResult(job_id=job, state="succeeded", attempt=1))
    live.end(1)  # never ends a successor's heartbeat
    assert redis_client.get(keys.job_heartbeat(job)) == "2"


def test_a_lapsed_heartbeat_revives_only_if_nobody_took_over(redis_client: redis.Redis) -> None:
    """A paused attempt whose heartbeat lapsed may renew it while still current."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()
    wait_until("the heartbeat to lapse", lambda: not redis_client.exists(keys.job_heartbeat(job)))
    assert live.beat(1) is True
    assert redis_client.get(keys.job_heartbeat(job)) == "1"


def test_cancel_is_seen_between_steps(redis_client: redis.Redis) -> None:
    """stop_reason reports a cancel request to the current attempt."""
    job = new_job()
    live = Liveness(redis_client, job, JobConfig())
    live.claim()
    redis_client.set(keys.job_cancel(job), "1")
    assert live.stop_reason(1) == CANCELLED


def test_heartbeat_thread_keeps_the_attempt_alive(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """The thread renews past many TTLs, runs its tick, and deletes its key on exit."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()
    ticks: list[float] = []
    renewed = threading.Event()  # set by the 12th tick: 1.2 s, three TTLs of 0.4 s

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) >= 12:
            renewed.set()

    with Heartbeat(live, 1, EventLog(settings), on_tick=tick):
        assert renewed.wait(20), f"only {len(ticks)} renewals"
        assert redis_client.get(keys.job_heartbeat(job)) == "1"
    assert not redis_client.exists(keys.job_heartbeat(job))


def test_heartbeat_thread_learns_it_was_superseded(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """When a newer attempt exists, the renewal is refused and ``superseded`` is set."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()
    with Heartbeat(live, 1, EventLog(settings)) as beat:
        redis_client.incr(keys.job_attempt(job))
        assert beat.superseded.wait(20), "the thread never noticed the newer attempt"


def test_heartbeat_tick_errors_are_logged_not_fatal(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """A failing tick is logged as job_heartbeat_error and the heartbeat goes on."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()

    calls: list[int] = []
    again = threading.Event()  # a second tick ran: the first one's error was logged

    def broken() -> None:
        calls.append(1)
        if len(calls) >= 2:
            again.set()
        raise OSError("disk on fire")

    with Heartbeat(live, 1, EventLog(settings), on_tick=broken):
        assert again.wait(20), "the heartbeat stopped after a failing tick"
        assert redis_client.get(keys.job_heartbeat(job)) == "1"
    [first, *_] = events(settings, "job_heartbeat_error", job)
    assert first["where"] == "tick" and first["error"] == "OSError: disk on fire"


def test_watchdog_waits_then_takes_over_a_silent_attempt(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """acquire() watches a live attempt and claims a new one once its heartbeat is stale."""
    job = new_job()
    live = Liveness(redis_client, job, SHORT)
    live.claim()
    got = acquire(live, EventLog(settings), pid=1)
    assert isinstance(got, Claimed) and got.attempt == 2 and got.took_over_from == 1
    assert [e["attempt"] for e in events(settings, "job_watchdog", job)] == [1]
    assert [e["stale_attempt"] for e in events(settings, "job_takeover", job)] == [1]


def test_watchdog_returns_when_the_live_attempt_commits(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """acquire() on a live attempt returns Finished once that attempt commits its result."""
    job = new_job()
    live = Liveness(redis_client, job, JobConfig(watchdog_poll_s=0.01))
    live.claim()
    polls = 0

    def commit_on_third_poll(_: float) -> None:
        nonlocal polls
        polls += 1
        if polls == 3:
            commit_result(redis_client, JobResult(job_id=job, state="succeeded", attempt=1))

    assert isinstance(acquire(live, EventLog(settings), sleep=commit_on_third_poll), Finished)
    assert redis_client.get(keys.job_attempt(job)) == "1"


def test_concurrent_claims_start_one_attempt(redis_client: redis.Redis) -> None:
    """Many deliveries claiming at once: exactly one gets an attempt."""
    job = new_job()
    results: list[object] = []
    barrier = threading.Barrier(8)

    def claim() -> None:
        client = redis.Redis(connection_pool=redis_client.connection_pool)
        barrier.wait()
        results.append(Liveness(client, job, JobConfig()).claim())

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Claimed) for r in results) == 1
    assert sum(isinstance(r, Live) for r in results) == 7


def test_job_config_validates_its_environment(tmp_path: Path) -> None:
    """Bad timing variables are refused with the variable named."""
    from runner.core.settings import SettingsError

    with pytest.raises(SettingsError, match="SLOTRUNNER_HEARTBEAT_TTL_S='soon'"):
        JobConfig.from_env({"SLOTRUNNER_HEARTBEAT_TTL_S": "soon"})
    with pytest.raises(SettingsError, match="at most half"):
        JobConfig.from_env(
            {"SLOTRUNNER_HEARTBEAT_TTL_S": "1", "SLOTRUNNER_HEARTBEAT_INTERVAL_S": "1"}
        )
    with pytest.raises(SettingsError, match="SLOTRUNNER_SLOT_WAIT_S"):
        JobConfig.from_env({"SLOTRUNNER_SLOT_WAIT_S": "-1"})
    assert JobConfig.from_env({"SLOTRUNNER_SLOT_WAIT_S": "0"}).slot_wait_s == 0
    assert JobConfig.from_env({}) == JobConfig()
