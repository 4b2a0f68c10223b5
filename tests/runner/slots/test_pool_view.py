"""Several hosts, one view: each host's slots and beat in the shared Redis, shown by
``slotrunner slots list --pool`` with a host whose beat stopped marked dead."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

from runner.cli.main import main
from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp, write_stamp
from runner.jobs import events as job_events
from runner.slots.host_beat import HostBeat
from runner.slots.pool import SlotPool


def host(tmp_path: Path, redis_url: str, name: str) -> Settings:
    home = tmp_path / name
    home.mkdir()
    return Settings.from_env(
        {
            "SLOTRUNNER_HOME": str(home),
            "REDIS_URL": redis_url,
            "SLOTRUNNER_SLOTS": "2",
            "SLOTRUNNER_HOST_ID": f"{name}-{uuid.uuid4().hex[:8]}",
            "SLOTRUNNER_TOOLSERVER_URL": f"http://{name}.example:8765",
        }
    )


def pool_of(settings: Settings, client: redis.Redis | None = None) -> SlotPool:
    client = client or redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    return SlotPool(settings, client, EventLog(settings))


def cli(settings: Settings, *args: str) -> str:
    env = {**settings.to_env(), "COLUMNS": "200"}
    result = CliRunner().invoke(main, ["slots", "list", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def pool_json(settings: Settings) -> dict[str, dict[str, object]]:
    return {h["host"]: h for h in json.loads(cli(settings, "--pool", "--json"))}


def slots_of(view: dict[str, object]) -> dict[str, dict[str, object]]:
    return {s["slot_id"]: s for s in view["slots"]}  # type: ignore[attr-defined]


def test_the_pool_shows_every_hosts_slots_and_marks_a_host_whose_beat_stopped(
    tmp_path: Path, redis_url: str
) -> None:
    """Two hosts on one Redis, same slot ids: each host's leases under its own name; the
    host whose beat expired is `dead (last beat 42s ago)`; plain `slots list` unchanged."""
    a, b = host(tmp_path, redis_url, "a"), host(tmp_path, redis_url, "b")
    pool_a, pool_b = pool_of(a), pool_of(b)
    first = pool_a.lease("job-a", 1)
    pool_a.lease("job-c", 3)
    taken = pool_b.lease("job-b", 2)
    pool_b.release(taken.slot_id, "job-b", taken.generation)
    HostBeat(a, pool_a.redis, pool_a, pool_a.log, interval_s=60).beat()
    # B's last beat, through the writer's seams: 42 s ago, and alive for 10 ms only.
    past = time.time() - 42
    stopped = HostBeat(
        b, pool_b.redis, pool_b, pool_b.log, interval_s=5, dead_after_s=0.01, clock=lambda: past
    )
    stopped.beat()
    time.sleep(0.05)

    hosts = pool_json(a)
    view_a, view_b = hosts[a.host], hosts[b.host]
    assert view_a["status"] == "live" and view_a["toolserver_url"] == "http://a.example:8765"
    assert view_b["status"] == "dead" and float(view_b["last_beat_age_s"]) >= 42  # type: ignore[arg-type]
    slots_a, slots_b = slots_of(view_a), slots_of(view_b)
    assert first.slot_id == taken.slot_id == "S0"  # slot ids repeat across hosts
    assert {k: slots_a["S0"][k] for k in ("generation", "job_id", "attempt", "state")} == {
        "generation": 1,
        "job_id": "job-a",
        "attempt": 1,
        "state": "leased",
    }
    assert slots_a["S1"]["job_id"] == "job-c" and slots_a["S1"]["attempt"] == 3
    assert slots_b["S0"]["state"] == "idle" and slots_b["S0"]["generation"] == 1
    assert slots_b["S0"]["job_id"] is None and slots_b["S1"]["generation"] == 0

    table = cli(a, "--pool")
    row_b = next(line for line in table.splitlines() if b.host in line and " S0 " in line)
    assert re.search(r"dead \(last beat 4\ds ago\)", row_b), row_b
    row_a = next(line for line in table.splitlines() if a.host in line and " S0 " in line)
    assert "live" in row_a and "job-a" in row_a and "leased" in row_a
    # Without --pool: this host's stamps from its disk, as before.
    local = json.loads(cli(a, "--json"))
    assert [(s["slot_id"], s["host"], s["job_id"]) for s in local] == [
        ("S0", a.host, "job-a"),
        ("S1", a.host, "job-c"),
    ]


def test_a_view_redis_refuses_never_fails_a_release_and_the_next_beat_heals_it(
    tmp_path: Path, redis_url: str, closed_port: int
) -> None:
    """A release whose Redis is gone still releases (the stamp is the truth) and logs
    `slot_view_error`; a stamp changed behind the pool (the tool server poisons one) is
    in the view after the next beat, as is the release."""
    a = host(tmp_path, redis_url, "a")
    pool = pool_of(a)
    held = pool.lease("job-a", 1)
    gone = redis.Redis(port=closed_port, retry=Retry(NoBackoff(), 0), decode_responses=True)
    released = pool_of(a, gone).release(held.slot_id, "job-a", held.generation)
    assert released.state == SlotState.IDLE
    lines = [json.loads(line) for line in a.log_path.read_text().splitlines()]
    assert [e["slot_id"] for e in lines if e["event"] == job_events.SLOT_VIEW_ERROR] == ["S0"]
    other = a.slots_dir / "S1"
    poisoned = read_stamp(other)
    assert poisoned is not None
    write_stamp(other, poisoned.model_copy(update={"state": SlotState.POISONED, "reason": "x"}))
    client = pool.redis
    assert client.hget(keys.slot_view(a.host, "S0"), "state") == "leased"  # stale copy

    assert HostBeat(a, client, pool, pool.log, interval_s=60).beat() == 2
    slots = slots_of(pool_json(a)[a.host])
    assert slots["S0"]["state"] == "idle" and slots["S0"]["job_id"] is None
    assert slots["S1"]["state"] == "poisoned" and slots["S1"]["reason"] == "x"
    assert HostBeat(a, client, pool, pool.log, interval_s=60).beat() == 0  # nothing stale
