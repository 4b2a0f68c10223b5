"""Lease tokens: minted per lease, kept only as a hash outside work/, bound to the lease."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from pydantic import ValidationError

from runner.cli.main import main
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.jobs.models import JobSpec
from runner.slots.pool import SlotPool
from tools import registry, tokens


def pool_for(settings: Settings) -> SlotPool:
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    return SlotPool(settings, client, EventLog(settings))


def test_a_lease_mints_a_token_whose_hash_alone_is_kept_beside_work(settings: Settings) -> None:
    """The record holds the hash and the bound identity; the token is nowhere on the host."""
    pool = pool_for(settings)
    lease = pool.lease("job-A", 3, tools=["write_file", "read_file"])
    slot_dir = settings.slots_dir / lease.slot_id
    record = tokens.authenticate(settings.slots_dir, settings.host, lease.token)
    assert record is not None and record == tokens.read_record(slot_dir, lease.generation)
    assert (record.host, record.slot_id, record.generation, record.job_id, record.attempt) == (
        settings.host,
        lease.slot_id,
        lease.generation,
        "job-A",
        3,
    )
    assert record.tools == ("read_file", "write_file") and record.sha256 == tokens.digest(
        lease.token
    )
    assert lease.mcp_url == settings.toolserver_url + "/mcp"
    # Only the hash: not in the record, the stamp, the log, the work tree or Redis.
    secret = lease.token.encode()
    for path in settings.home.rglob("*"):
        assert not path.is_file() or secret not in path.read_bytes(), path
    assert not (slot_dir / "work" / "tokens").exists()
    # Every key of any type, as Redis would serialize it (the Redis is the session's).
    raw = redis.Redis.from_url(settings.redis_url or "")
    try:
        token = lease.token.encode()
        assert all(token not in k and token not in (raw.dump(k) or b"") for k in raw.keys("*"))
    finally:
        raw.close()
    assert "token" not in lease.model_dump() and lease.token not in repr(lease)


def test_forged_and_foreign_tokens_do_not_authenticate(settings: Settings) -> None:
    """A changed secret, another slot's name, another host: none finds a record."""
    pool = pool_for(settings)
    a, b = pool.lease("job-A", 1), pool.lease("job-B", 1)
    assert a.slot_id != b.slot_id
    prefix, slot, generation, secret = a.token.split(".")
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    forged = [
        f"{prefix}.{slot}.{generation}.{flipped}",
        f"{prefix}.{b.slot_id}.{b.generation}.{secret}",  # A's secret under B's name
        f"{prefix}.{slot}.{int(generation) + 1}.{secret}",
        "",
        "slr..1.x",
        "slr.S0.x.y",
        "slr.../..1.x",
        secret,
    ]
    for token in forged:
        assert tokens.authenticate(settings.slots_dir, settings.host, token) is None, token
    assert tokens.authenticate(settings.slots_dir, "another-host", a.token) is None
    assert tokens.authenticate(settings.slots_dir, settings.host, a.token) is not None


def test_old_records_are_pruned_past_the_kept_generations(settings: Settings) -> None:
    """A slot keeps the records of its last KEEP_RECORDS leases, not every lease ever."""
    slot_dir = settings.slots_dir / "S0"
    slot_dir.mkdir(parents=True)
    issued = []
    for generation in range(1, tokens.KEEP_RECORDS + 3):
        issued.append(
            tokens.issue(
                slot_dir,
                host="h",
                slot_id="S0",
                generation=generation,
                job_id="job-A",
                attempt=1,
                tools=None,
            )
        )
    kept = sorted(int(p.stem) for p in (slot_dir / tokens.TOKENS_DIR).glob("*.json"))
    assert kept == list(range(3, tokens.KEEP_RECORDS + 3))
    assert tokens.authenticate(settings.slots_dir, "h", issued[0]) is None
    assert tokens.authenticate(settings.slots_dir, "h", issued[-1]) is not None


def test_a_record_read_before_is_not_answered_once_its_file_changed(tmp_path: Path) -> None:
    """read_record answers a record it read before from memory only while the file is
    the same: one minted again for the same generation (a lease that never wrote its
    stamp), one damaged in place, one pruned are each seen at once."""
    slot_dir = tmp_path / "S0"
    slot_dir.mkdir()

    def mint(job_id: str) -> str:
        return tokens.issue(
            slot_dir, host="h", slot_id="S0", generation=5, job_id=job_id, attempt=1, tools=None
        )

    first = mint("job-A")
    assert tokens.authenticate(tmp_path, "h", first) is not None
    assert tokens.authenticate(tmp_path, "h", first) is not None  # answered again
    second = mint("job-B")  # the same generation, minted again: a new file by rename
    assert tokens.authenticate(tmp_path, "h", first) is None
    record = tokens.authenticate(tmp_path, "h", second)
    assert record is not None and record.job_id == "job-B"

    path = tokens.record_path(slot_dir, 5)
    with open(path, "wb") as f:  # damaged in place: the same file, cut short
        f.write(b"{ not a record")
    with pytest.raises(ValueError, match="is not a token record"):
        tokens.read_record(slot_dir, 5)
    assert tokens.authenticate(tmp_path, "h", second) is None  # fails closed

    mint("job-C")
    path.unlink()  # pruned
    assert tokens.read_record(slot_dir, 5) is None


def test_the_spec_tools_are_checked_against_the_registry() -> None:
    """Unknown names reject the spec, naming them; the default is every tool."""
    base = {"repo": "/r", "planner": {"kind": "scripted", "steps": [{"tool": "read_file"}]}}
    assert JobSpec.model_validate(base).tools is None
    assert JobSpec.model_validate({**base, "tools": ["read_file"]}).tools == ["read_file"]
    with pytest.raises(ValidationError, match="unknown tool\\(s\\) nope, shell; known: "):
        JobSpec.model_validate({**base, "tools": ["read_file", "shell", "nope"]})
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**base, "tools": []})
    assert set(registry.DESCRIPTIONS) == set(registry.TOOLS)


def test_cli_lease_prints_the_token_and_mcp_url(settings: Settings) -> None:
    """slots lease --json adds token and mcp_url to the stamp; --tool narrows the lease."""
    env = settings.to_env()
    runner = CliRunner()
    out = runner.invoke(
        main, ["slots", "lease", "--job", "job-c", "--tool", "read_file", "--json"], env=env
    )
    assert out.exit_code == 0, out.output
    leased = json.loads(out.stdout)
    assert leased["mcp_url"] == settings.toolserver_url + "/mcp"
    record = tokens.authenticate(settings.slots_dir, settings.host, leased["token"])
    assert record is not None and record.tools == ("read_file",)
    assert record.generation == leased["generation"] and record.job_id == "job-c"
    human = runner.invoke(main, ["slots", "lease", "--job", "job-d"], env=env)
    assert human.exit_code == 0 and "token   slr." in human.stdout and "/mcp" in human.stdout
    bad = runner.invoke(main, ["slots", "lease", "--job", "job-e", "--tool", "nope"], env=env)
    assert bad.exit_code == 2 and "unknown tool(s) nope" in bad.stderr
