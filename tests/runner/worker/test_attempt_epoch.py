"""The pool's attempt epoch: after Redis lost its data, no host reissues a number that
another host issued before the loss, a frozen or dead host's included (#16).

Each host's floor (tests/runner/worker/test_attempt_floor.py) covers its own numbers
only. Here two hosts (two homes) share one private embedded Redis that the tests
FLUSHALL, as the three-host chaos campaign's ``redis_wipe`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.admission.witness import UNREADABLE
from runner.core import keys
from runner.jobs.config import JobConfig
from runner.redis_server import EmbeddedRedis
from runner.worker.attempt_floor import AttemptFloorError
from runner.worker.liveness import SUPERSEDED, Claimed, Liveness
from tests.support.disk import Disk

JOB = "job-epoch"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[redis.Redis]:
    server = EmbeddedRedis(tmp_path / "r")
    conn = redis.Redis.from_url(server.ensure(), decode_responses=True)
    try:
        yield conn
    finally:
        conn.close()
        server.leave()


def host(client: redis.Redis, tmp_path: Path, name: str, job_id: str = JOB) -> Liveness:
    """A fresh worker process's view of ``job_id`` on host ``name`` (its own home)."""
    home = tmp_path / name
    home.mkdir(exist_ok=True)
    return Liveness(client, job_id, JobConfig(), home=home)


def claim(liveness: Liveness) -> int:
    state = liveness.claim()
    assert isinstance(state, Claimed), state
    return state.attempt


def claim_and_end(liveness: Liveness) -> int:
    attempt = claim(liveness)
    liveness.end(attempt)
    return attempt


def test_without_a_loss_numbers_count_from_one_across_hosts(
    client: redis.Redis, tmp_path: Path
) -> None:
    assert claim_and_end(host(client, tmp_path, "A")) == 1
    assert claim_and_end(host(client, tmp_path, "B")) == 2
    assert claim_and_end(host(client, tmp_path, "A", "job-other")) == 1
    assert client.hget(keys.ATTEMPT_EPOCH, "reborn") == "0"


def test_after_a_wipe_another_host_never_reissues_a_frozen_hosts_number(
    client: redis.Redis, tmp_path: Path
) -> None:
    """Host B ran attempt 1, host A took over as attempt 2 and froze. Redis loses
    everything. B's own floor says 1, so without the epoch B would claim 2: A's
    number, and A would wake to find itself current (the campaign's seeds 2 and 5)."""
    assert claim_and_end(host(client, tmp_path, "B")) == 1
    frozen = host(client, tmp_path, "A")
    assert claim(frozen) == 2
    client.flushall()
    taken = claim(host(client, tmp_path, "B"))
    assert taken > 2
    assert client.hget(keys.ATTEMPT_EPOCH, "reborn") == "1"
    assert taken == int(client.hget(keys.ATTEMPT_EPOCH, "born_ms") or 0) + 1
    # A wakes: its renewal is refused and its next step sees it was superseded.
    assert not frozen.beat(2)
    assert frozen.stop_reason(2) == SUPERSEDED
    assert client.get(keys.job_heartbeat(JOB)) == str(taken)


def test_a_job_first_claimed_after_a_wipe_starts_above_the_birth(
    client: redis.Redis, tmp_path: Path
) -> None:
    """A job whose counter is missing may be one whose numbers were lost with Redis:
    in a reborn epoch every such job starts above it, and counts on from there."""
    assert claim_and_end(host(client, tmp_path, "A")) == 1
    client.flushall()
    first = claim_and_end(host(client, tmp_path, "A", "job-new"))
    born = int(client.hget(keys.ATTEMPT_EPOCH, "born_ms") or 0)
    assert first == born + 1
    assert claim_and_end(host(client, tmp_path, "B", "job-new")) == born + 2
    assert client.get(keys.job_attempt("job-new")) == str(born + 2)


def test_evidence_arriving_later_marks_the_epoch_reborn(
    client: redis.Redis, tmp_path: Path
) -> None:
    """A host that never saw the old epoch re-creates it unmarked (the limit the
    module names); the first claim of a host that did see it marks it reborn, and
    jobs without a counter start above the birth from then on."""
    assert claim_and_end(host(client, tmp_path, "A")) == 1
    client.flushall()
    assert claim_and_end(host(client, tmp_path, "fresh", "job-x")) == 1
    assert client.hget(keys.ATTEMPT_EPOCH, "reborn") == "0"
    assert claim_and_end(host(client, tmp_path, "A", "job-y")) > 1
    assert client.hget(keys.ATTEMPT_EPOCH, "reborn") == "1"
    assert claim_and_end(host(client, tmp_path, "fresh", "job-x")) == 2


def test_an_unreadable_witness_is_evidence(client: redis.Redis, tmp_path: Path) -> None:
    """Fail closed: a witness that says nothing usable counts as having seen a loss."""
    liveness = host(client, tmp_path, "A")
    assert claim_and_end(liveness) == 1
    assert liveness.epochs.witness is not None
    liveness.epochs.witness.path.write_text("{not json")
    assert liveness.epochs.witness.read() == UNREADABLE
    client.flushall()
    assert claim_and_end(host(client, tmp_path, "A", "job-z")) > 1
    assert client.hget(keys.ATTEMPT_EPOCH, "reborn") == "1"


def test_an_epoch_that_cannot_be_made_durable_refuses_the_attempt(
    client: redis.Redis, tmp_path: Path
) -> None:
    """A host that could not record the epoch would not know, after the next loss,
    that there was one: the claim is given up before any work, its heartbeat ended."""
    liveness = host(client, tmp_path, "A")
    assert liveness.epochs.witness is not None
    disk = Disk(failing=True)
    liveness.epochs.witness.fsync = disk.fsync
    with pytest.raises(AttemptFloorError, match="attempt epoch could not be made durable"):
        liveness.claim()
    assert disk.calls
    assert client.get(keys.job_heartbeat(JOB)) is None
    disk.failing = False
    assert claim_and_end(liveness) == 2
