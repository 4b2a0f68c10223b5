"""Slot leases: generations only grow (I5), release happens exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.redis_server import EmbeddedRedis
from runner.slots.pool import NoSlotFree, ReleaseRefused, SlotPool


def pool_for(settings: Settings) -> SlotPool:
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    return SlotPool(settings, client, EventLog(settings))


def log_events(settings: Settings) -> list[dict[str, object]]:
    return [json.loads(line) for line in settings.log_path.read_text().splitlines()]


def cli_lease(
    settings: Settings, job: str, env_extra: dict[str, str] | None = None
) -> dict[str, object]:
    env = {**os.environ, **settings.to_env(), **(env_extra or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "slots", "lease", "--job", job, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_lease_stamps_slot_and_logs(settings: Settings) -> None:
    """A lease writes the stamp outside work/, mirrors the generation and logs slot_leased."""
    pool = pool_for(settings)
    stamp = pool.lease("job-A", 1)
    slot_dir = settings.slots_dir / stamp.slot_id
    on_disk = read_stamp(slot_dir)
    assert on_disk == stamp
    assert (slot_dir / "stamp.json").exists() and not (slot_dir / "work" / "stamp.json").exists()
    assert stamp.state == SlotState.LEASED and stamp.job_id == "job-A" and stamp.generation == 1
    assert pool.redis.get(keys.slot_generation(settings.host, stamp.slot_id)) == "1"
    leased = [e for e in log_events(settings) if e["event"] == "slot_leased"]
    assert leased[-1] | {} == leased[-1] and leased[-1]["generation"] == 1
    assert {"ts", "host", "slot_id", "generation", "job_id", "attempt"} <= set(leased[-1])


def test_generation_grows_on_every_lease(settings: Settings) -> None:
    """Lease, release, lease again: the same slot comes back one generation higher."""
    pool = pool_for(settings.with_(slots=1))
    first = pool.lease("job-A", 1)
    pool.release(first.slot_id, "job-A", first.generation)
    second = pool.lease("job-B", 1)
    assert second.slot_id == first.slot_id
    assert second.generation == first.generation + 1


def test_busy_pool_refuses_after_wait(settings: Settings) -> None:
    """With every slot leased, a lease waits its bound and then raises NoSlotFree."""
    pool = pool_for(settings)
    for n in range(settings.slots):
        pool.lease(f"job-{n}", 1)
    with pytest.raises(NoSlotFree, match="busy"):
        pool.lease("job-late", 1, wait_s=0.2, poll_s=0.05)


def test_second_release_is_refused_and_logged(settings: Settings) -> None:
    """Releasing twice changes the state once; the second release is refused and logged."""
    pool = pool_for(settings)
    stamp = pool.lease("job-A", 1)
    pool.release(stamp.slot_id, "job-A", stamp.generation)
    again = pool.lease("job-B", 1)  # the slot may be recycled meanwhile
    refused = f"is not leased to job-A at generation {stamp.generation} \\(leased job-B@"
    with pytest.raises(ReleaseRefused, match=refused):
        pool.release(stamp.slot_id, "job-A", stamp.generation)
    current = read_stamp(settings.slots_dir / again.slot_id)
    assert current is not None and current.job_id == "job-B" and current.state == SlotState.LEASED
    refusals = [e for e in log_events(settings) if e["event"] == "slot_release_refused"]
    assert len(refusals) == 1 and refusals[0]["job_id"] == "job-A"


def test_monotonic_across_process_with_redis_flushed(tmp_path: Path) -> None:
    """A new process facing a Redis that lost everything still counts up from the stamp."""
    server = EmbeddedRedis(tmp_path / "own-redis")
    url = server.ensure()
    try:
        settings = Settings.from_env(
            {
                "SLOTRUNNER_HOME": str(tmp_path / "home"),
                "REDIS_URL": url,
                "SLOTRUNNER_SLOTS": "1",
                "SLOTRUNNER_HOST_ID": "h1",
            }
        )
        pool = pool_for(settings)
        for n in range(3):
            stamp = pool.lease(f"job-{n}", 1)
            pool.release(stamp.slot_id, f"job-{n}", stamp.generation)
        assert stamp.generation == 3
        redis.Redis.from_url(url).flushall()
        leased = cli_lease(settings, "job-after-flush")
        assert leased["generation"] == 4
        assert (
            redis.Redis.from_url(url, decode_responses=True).get(keys.slot_generation("h1", "S0"))
            == "4"
        )
    finally:
        server.leave()


def test_monotonic_with_local_stamp_deleted(settings: Settings) -> None:
    """A lost local stamp (new disk) is covered by the Redis mirror: no generation reissued."""
    settings = settings.with_(slots=1)
    pool = pool_for(settings)
    for n in range(2):
        stamp = pool.lease(f"job-{n}", 1)
        pool.release(stamp.slot_id, f"job-{n}", stamp.generation)
    (settings.slots_dir / "S0" / "stamp.json").unlink()
    leased = cli_lease(settings, "job-after-disk-loss")
    assert leased["generation"] == 3


def test_release_cli_refuses_wrong_generation(settings: Settings) -> None:
    """The CLI refuses a release that names an old generation, with a clear error."""
    pool = pool_for(settings)
    stamp = pool.lease("job-A", 1)
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.cli.main",
            "slots",
            "release",
            "--slot",
            stamp.slot_id,
            "--job",
            "job-A",
            "--generation",
            str(stamp.generation - 1),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "not leased to job-A" in proc.stderr and "Traceback" not in proc.stderr
    current = read_stamp(settings.slots_dir / stamp.slot_id)
    assert current is not None and current.state == SlotState.LEASED
