"""The local attempt floor: a Redis that lost its data never reissues an attempt number (I5).

These tests FLUSHALL, so they run their own embedded Redis, never the session one.
"""

from __future__ import annotations

import multiprocessing
import shutil
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.core import keys
from runner.core.settings import Settings
from runner.jobs.config import JobConfig
from runner.redis_server import EmbeddedRedis, connect
from runner.worker.attempt_floor import ATTEMPTS_DIR, AttemptFloor, AttemptFloorError, floor_path
from runner.worker.liveness import EPOCH_DIR, Claimed, Live, Liveness
from tests.support.disk import Disk

JOB = "job-floor"
_PROC_DEADLINE_S = 60.0
_CLAIMS_PER_PROCESS = 25


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A private embedded Redis that a test may wipe."""
    server = EmbeddedRedis(tmp_path / "r")
    url = server.ensure()
    try:
        yield url
    finally:
        server.leave()


@pytest.fixture
def floor_settings(tmp_path: Path, own_redis: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    return Settings.from_env({"SLOTRUNNER_HOME": str(home), "REDIS_URL": own_redis})


@pytest.fixture
def client(floor_settings: Settings) -> Iterator[redis.Redis]:
    conn = connect(floor_settings)
    try:
        yield conn
    finally:
        conn.close()


def _claim_and_end(liveness: Liveness) -> int:
    """Claim a fresh attempt and end its heartbeat at once, as a finished delivery would."""
    state = liveness.claim()
    assert isinstance(state, Claimed), state
    liveness.end(state.attempt)
    return state.attempt


def born_ms(client: redis.Redis) -> int:
    """When the pool's attempt epoch was created, on Redis's clock."""
    return int(client.hget(keys.ATTEMPT_EPOCH, "born_ms") or 0)


def _floor_file(settings: Settings, job_id: str = JOB) -> str:
    return floor_path(settings.home, job_id).read_text()


# -- spawned-process helper (module level so `spawn` can import it) --------------------


def _claim_many(home: str, url: str, job_id: str, barrier: Barrier, out: Any) -> None:
    settings = Settings.from_env({"SLOTRUNNER_HOME": home, "REDIS_URL": url})
    conn = connect(settings)
    liveness = Liveness(conn, job_id, JobConfig(), home=settings.home)
    claimed = []
    for _ in range(_CLAIMS_PER_PROCESS):
        barrier.wait(timeout=_PROC_DEADLINE_S)
        state = liveness.claim()
        if isinstance(state, Claimed):
            claimed.append(state.attempt)
            liveness.end(state.attempt)
        else:
            assert isinstance(state, Live)
    conn.close()
    out.put(claimed)


# -- tests ---------------------------------------------------------------------------


def test_claims_continue_above_local_floor_after_redis_wipe(
    floor_settings: Settings, client: redis.Redis
) -> None:
    """After FLUSHALL with the epoch witness gone too, the floor alone keeps the next
    claim at 4, not 1, and the floor file says 4."""
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert [_claim_and_end(liveness) for _ in range(3)] == [1, 2, 3]
    assert _floor_file(floor_settings) == "3\n"
    client.flushall()
    shutil.rmtree(floor_settings.home / EPOCH_DIR)
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert client.get(keys.job_attempt(JOB)) is None
    state = liveness.claim()
    assert isinstance(state, Claimed) and state.attempt == 4
    assert client.get(keys.job_attempt(JOB)) == "4"
    assert client.get(keys.job_heartbeat(JOB)) == "4"
    assert _floor_file(floor_settings) == "4\n"


def test_redis_counter_above_floor_still_wins(
    floor_settings: Settings, client: redis.Redis
) -> None:
    """A counter raised elsewhere (another host) is honoured: the claim is counter + 1."""
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert _claim_and_end(liveness) == 1
    client.set(keys.job_attempt(JOB), 9)
    assert _claim_and_end(liveness) == 10
    assert _floor_file(floor_settings) == "10\n"


def test_concurrent_claims_after_wipe_get_distinct_attempts(
    floor_settings: Settings, client: redis.Redis, own_redis: str
) -> None:
    """Two spawned processes claiming one job after a wipe never share an attempt number."""
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert [_claim_and_end(liveness) for _ in range(3)] == [1, 2, 3]
    client.flushall()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    args = (str(floor_settings.home), own_redis, JOB, barrier, out)
    procs = [ctx.Process(target=_claim_many, args=args) for _ in range(2)]
    for proc in procs:
        proc.start()
    results: list[list[int]] = [out.get(timeout=_PROC_DEADLINE_S) for _ in procs]
    for proc in procs:
        proc.join(timeout=_PROC_DEADLINE_S)
        assert proc.exitcode == 0
    attempts = [a for got in results for a in got]
    assert attempts, "no process ever claimed"
    assert len(attempts) == len(set(attempts)), sorted(attempts)
    assert min(attempts) > born_ms(client) > 3
    assert _floor_file(floor_settings) == f"{max(attempts)}\n"
    assert client.get(keys.job_attempt(JOB)) == str(max(attempts))


def test_failed_durable_write_refuses_the_attempt(
    floor_settings: Settings, client: redis.Redis
) -> None:
    """A floor fsync failure raises a clear error, ends the heartbeat, and burns the number."""
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert _claim_and_end(liveness) == 1
    disk = Disk(failing=True)
    assert liveness.floor is not None
    liveness.floor.fsync = disk.fsync  # the floor's writes go through a failing disk
    with pytest.raises(AttemptFloorError, match="attempt 2 was not started"):
        liveness.claim()
    assert disk.calls == [str(floor_settings.home / ATTEMPTS_DIR)]
    assert client.get(keys.job_heartbeat(JOB)) is None
    assert _floor_file(floor_settings) == "1\n"
    disk.failing = False
    assert _claim_and_end(liveness) == 3


def test_corrupt_floor_file_fails_closed(floor_settings: Settings, client: redis.Redis) -> None:
    """A floor file that is not a number refuses the claim, naming the file."""
    liveness = Liveness(client, JOB, JobConfig(), home=floor_settings.home)
    assert _claim_and_end(liveness) == 1
    floor_path(floor_settings.home, JOB).write_text("garbage\n")
    with pytest.raises(AttemptFloorError, match="not an attempt number") as err:
        liveness.claim()
    assert str(floor_path(floor_settings.home, JOB)) in str(err.value)
    assert client.get(keys.job_heartbeat(JOB)) is None


@pytest.mark.parametrize("job_id", ["../escape", "a/b", "", ".hidden", "job\n", "x" * 129])
def test_job_ids_that_could_leave_the_floor_directory_are_refused(
    tmp_path: Path, job_id: str
) -> None:
    """A job id that is not a valid id never names a floor file (none outside attempts/)."""
    with pytest.raises(AttemptFloorError, match="not valid"):
        AttemptFloor(tmp_path, job_id)
    assert not (tmp_path / ATTEMPTS_DIR).exists()


def test_floor_never_moves_backwards(tmp_path: Path) -> None:
    """raise_to keeps the higher of the recorded and the given attempt."""
    floor = AttemptFloor(tmp_path, JOB)
    assert floor.read() == 0
    with floor.locked():
        floor.raise_to(5)
        floor.raise_to(2)
    assert floor.read() == 5
