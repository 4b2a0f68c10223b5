"""The admission desk after Redis restarts empty: it fails closed for a recovery hold."""

from __future__ import annotations

import multiprocessing
import re
import uuid
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import redis

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import AdmissionRefused, RefusalReason, StaleCompletion
from runner.admission.witness import UNREADABLE, EpochWitness, witness_path
from runner.agent.planners import RECOVERY_GRACE_S, admission_desk, http_timeout_s
from runner.core.settings import SettingsError
from runner.jobs.config import JobConfig
from runner.jobs.models import OpenAIPlanner
from runner.redis_server import EmbeddedRedis
from tests.support.clock import FakeClock
from tests.support.disk import Disk

HOLD_S = 1.0  # the recovery hold of the tests that wait for its end
LONG_HOLD_S = 60.0  # a hold the test never sees end
REPLY_S = 30.0  # longest wait for a holder process to answer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """An embedded Redis of this module's own, so wiping it touches no other test."""
    embedded = EmbeddedRedis(tmp_path_factory.mktemp("admission-redis"))
    embedded.ensure()
    yield embedded
    embedded.leave()


@pytest.fixture
def url(server: EmbeddedRedis) -> str:
    return server.ensure()


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(url, decode_responses=True)
    yield connection
    connection.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _run() -> str:
    return f"wipe-{uuid.uuid4().hex[:12]}"


def _holder(url: str, eval_run: str, bound: int, home: str, step: int, conn: Connection) -> None:
    """A worker process holding one lease; it applies the parent's ops to that lease."""
    client = redis.Redis.from_url(url, decode_responses=True)
    desk = AdmissionDesk(client, eval_run, bound, home=Path(home), recovery_hold_s=HOLD_S)
    lease = desk.acquire(step, 0)
    conn.send(("granted", lease.epoch))
    while (op := conn.recv()) != "exit":
        try:
            conn.send((op, getattr(desk, op)(lease)))
        except StaleCompletion as exc:
            conn.send(("stale", exc.reason.value))
        except Exception as exc:
            conn.send(("error", repr(exc)))
    client.close()


def _ask(conn: Connection, op: str) -> tuple[str, object]:
    conn.send(op)
    assert conn.poll(REPLY_S), f"the holder did not answer {op!r}"
    reply: tuple[str, object] = conn.recv()
    return reply


def test_a_wiped_desk_grants_nothing_until_its_hold_ends(
    server: EmbeddedRedis, url: str, client: redis.Redis, home: Path
) -> None:
    """Three holder processes at the bound; Redis restarts empty; a fresh caller of the
    same host is refused (or waits) during the hold while the holders' expire/cancel
    adopt; after the hold it is granted, and the adopted leases still count."""
    bound, eval_run = 3, _run()
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for step in (1, 2, 3):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_holder, args=(url, eval_run, bound, str(home), step, child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        assert all(pipe.poll(REPLY_S) for pipe in pipes), "a holder got no lease"
        epochs = {pipe.recv()[1] for pipe in pipes}
        assert len(epochs) == 1
        old_epoch = epochs.pop()
        assert EpochWitness(home, eval_run).read() == old_epoch
        before = AdmissionDesk(client, eval_run, bound)
        with pytest.raises(AdmissionRefused) as refused:
            before.acquire(9, 0)
        assert refused.value.reason is RefusalReason.BOUND

        def check() -> dict[str, int]:
            stats = before.stats()
            assert 0 <= stats["in_flight"] <= bound, stats
            assert stats["underflow_prevented"] == 0
            return stats

        server.restart(wipe=True)
        assert client.keys("admission:*") == []

        fresh = AdmissionDesk(client, eval_run, bound, home=home, recovery_hold_s=HOLD_S)
        with pytest.raises(AdmissionRefused) as refused:
            fresh.acquire(10, 0)  # re-creates the desk: the witness says one existed
        assert refused.value.reason is RefusalReason.RECOVERING
        assert fresh.epoch() not in (None, old_epoch)
        stats = check()
        assert (stats["recoveries"], stats["in_flight"], stats["refused"]) == (1, 0, 1)
        assert stats["recovery_hold_left_ms"] > 0

        # A caller that may wait keeps waiting: its (fake) deadline passes in the hold.
        clock = FakeClock()
        waiter = AdmissionDesk(
            client, eval_run, bound, home=home, clock=clock, sleep=clock.sleep, poll_s=0.1
        )
        queued: list[int] = []
        clock.on_sleep = lambda: queued.append(before.stats()["waiting"])
        with pytest.raises(AdmissionRefused) as refused:
            waiter.acquire(11, 1.0)
        assert refused.value.reason is RefusalReason.DEADLINE
        assert clock.sleeps == 10 and set(queued) == {1}
        assert check()["acquired"] == 0

        one, two, three = pipes
        # The third request answered: its body is foreign, so stale; its release frees nothing.
        assert _ask(three, "apply") == ("stale", "foreign")
        assert _ask(three, "release") == ("release", False)
        stats = check()
        assert (stats["in_flight"], stats["stale_release"], stats["committed"]) == (0, 1, 0)
        # The other two are still out: their timeout and cancel count them again.
        assert _ask(one, "expire") == ("expire", True)
        assert _ask(two, "cancel") == ("cancel", True)
        assert (check()["in_flight"], check()["adopted"]) == (2, 2)

        lease = fresh.acquire(12, 10.0)  # waits for the end of the hold, then granted
        stats = check()
        assert (stats["recovery_hold_left_ms"], stats["in_flight"], stats["acquired"]) == (0, 3, 1)
        with pytest.raises(AdmissionRefused) as refused:
            fresh.acquire(13, 0)
        assert refused.value.reason is RefusalReason.BOUND  # the adopted two still count

        assert _ask(one, "apply") == ("stale", "expired")
        assert _ask(one, "release") == ("release", True)
        assert _ask(one, "release") == ("release", False)
        assert _ask(two, "release") == ("release", True)
        assert fresh.release(lease) is True
        stats = check()
        assert (stats["in_flight"], stats["double_release"], stats["committed"]) == (0, 1, 0)
        assert EpochWitness(home, eval_run).read() == fresh.epoch()
        for pipe in pipes:
            pipe.send("exit")
    finally:
        for proc in procs:
            proc.join(timeout=REPLY_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    client.delete(*vars(fresh.keys).values())


def test_a_holder_s_memory_is_evidence_without_a_witness(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    """With no home, the desk object that saw the old epoch brings the hold when it
    re-creates the desk; a caller with no evidence of its own is held too."""
    eval_run = _run()
    holder = AdmissionDesk(client, eval_run, 2, recovery_hold_s=LONG_HOLD_S)
    lease = holder.acquire(1, 0)
    server.restart(wipe=True)
    assert holder.expire(lease) is True
    newcomer = AdmissionDesk(client, eval_run, 2, recovery_hold_s=LONG_HOLD_S)
    with pytest.raises(AdmissionRefused) as refused:
        newcomer.acquire(2, 0)  # one of two free, but not during the hold
    assert refused.value.reason is RefusalReason.RECOVERING
    stats = newcomer.stats()
    assert (stats["recoveries"], stats["adopted"], stats["in_flight"]) == (1, 1, 1)
    client.delete(*vars(holder.keys).values())


def test_evidence_arriving_late_starts_the_hold(server: EmbeddedRedis, client: redis.Redis) -> None:
    """A caller without evidence re-creates the desk and is granted (the documented
    limit); the first call of a holder that saw the old epoch then starts the hold."""
    eval_run = _run()
    holder = AdmissionDesk(client, eval_run, 3, recovery_hold_s=LONG_HOLD_S)
    lease = holder.acquire(1, 0)
    server.restart(wipe=True)
    newcomer = AdmissionDesk(client, eval_run, 3, recovery_hold_s=LONG_HOLD_S)
    newcomer.acquire(2, 0)
    assert newcomer.stats()["recoveries"] == 0
    assert holder.cancel(lease) is True
    with pytest.raises(AdmissionRefused) as refused:
        newcomer.acquire(3, 0)
    assert refused.value.reason is RefusalReason.RECOVERING
    stats = newcomer.stats()
    assert (stats["recoveries"], stats["in_flight"]) == (1, 2)
    client.delete(*vars(holder.keys).values())


def test_a_waiter_whose_queue_entry_was_wiped_keeps_waiting(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    """A caller queued when Redis lost its data queues again and waits to its deadline,
    instead of being refused at once for an entry it did not give up."""
    eval_run = _run()
    AdmissionDesk(client, eval_run, 1).acquire(1, 0)
    clock = FakeClock()
    waiter = AdmissionDesk(
        client, eval_run, 1, clock=clock, sleep=clock.sleep, poll_s=0.5, recovery_hold_s=60
    )
    queued: list[int] = []

    def wipe_once() -> None:
        if clock.sleeps == 1:
            server.restart(wipe=True)
        else:
            queued.append(waiter.stats()["waiting"])

    clock.on_sleep = wipe_once
    with pytest.raises(AdmissionRefused) as refused:
        waiter.acquire(2, 3.0)
    assert refused.value.reason is RefusalReason.DEADLINE
    assert clock.sleeps == 6 and set(queued) == {1}
    stats = waiter.stats()
    assert (stats["recoveries"], stats["waiting"], stats["refused"]) == (1, 0, 1)
    client.delete(*vars(waiter.keys).values())


def test_first_use_has_no_hold_and_is_witnessed(client: redis.Redis, home: Path) -> None:
    """The first desk of an eval-run grants at once and its epoch is recorded; another
    process of the host, reading the matching witness, is not held either."""
    eval_run = _run()
    desk = AdmissionDesk(client, eval_run, 1, home=home, recovery_hold_s=LONG_HOLD_S)
    lease = desk.acquire(1, 0)
    assert EpochWitness(home, eval_run).read() == lease.epoch
    again = AdmissionDesk(client, eval_run, 1, home=home, recovery_hold_s=LONG_HOLD_S)
    with pytest.raises(AdmissionRefused) as refused:
        again.acquire(2, 0)
    assert refused.value.reason is RefusalReason.BOUND
    stats = again.stats()
    assert (stats["recoveries"], stats["recovery_hold_left_ms"]) == (0, 0)
    client.delete(*vars(desk.keys).values())


@pytest.mark.parametrize(
    "eval_run", ["../../outside", "..", "a/b/../../c", "/abs/path", "x" * 200, "é\x00€"]
)
def test_witness_files_stay_in_their_directory(tmp_path: Path, eval_run: str) -> None:
    """Any eval-run name maps to a hashed file name inside $SLOTRUNNER_HOME/admission."""
    path = witness_path(tmp_path, eval_run)
    assert path.parent == tmp_path / "admission"
    assert re.fullmatch(r"[0-9a-f]{32}\.json", path.name)
    witness = EpochWitness(tmp_path, eval_run)
    witness.record("ab" * 16)
    assert witness.read() == "ab" * 16
    assert sorted(tmp_path.rglob("*")) == [path.parent, path]
    assert witness_path(tmp_path, eval_run + "x") != path


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b'["ab"]',
        b'{"eval_run": "another-run", "epoch": "ab"}',
        b'{"eval_run": "RUN", "epoch": 5}',
        b'{"eval_run": "RUN", "epoch": "../x"}',
    ],
)
def test_a_corrupt_witness_is_evidence(client: redis.Redis, home: Path, content: bytes) -> None:
    """A witness file that says nothing usable fails closed: the desk is held."""
    eval_run = _run()
    path = witness_path(home, eval_run)
    path.parent.mkdir(parents=True)
    path.write_bytes(content.replace(b"RUN", eval_run.encode()))
    assert EpochWitness(home, eval_run).read() == UNREADABLE
    desk = AdmissionDesk(client, eval_run, 1, home=home, recovery_hold_s=LONG_HOLD_S)
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(1, 0)
    assert refused.value.reason is RefusalReason.RECOVERING
    assert desk.stats()["recoveries"] == 1
    client.delete(*vars(desk.keys).values())


def test_after_a_corrupt_witness_the_hold_ends_and_the_file_heals(
    client: redis.Redis, home: Path
) -> None:
    """Held first; granted after the hold; the witness then holds the desk's epoch."""
    eval_run = _run()
    witness = EpochWitness(home, eval_run)
    witness.path.parent.mkdir(parents=True)
    witness.path.write_bytes(b"\x00garbage")
    desk = AdmissionDesk(client, eval_run, 1, home=home, recovery_hold_s=HOLD_S)
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(1, 0)
    assert refused.value.reason is RefusalReason.RECOVERING
    lease = desk.acquire(2, 10.0)
    assert witness.read() == lease.epoch
    assert desk.release(lease) is True
    client.delete(*vars(desk.keys).values())


def test_an_unreadable_witness_is_evidence(client: redis.Redis, home: Path) -> None:
    """A witness path that cannot be read (here a directory) fails closed too."""
    eval_run = _run()
    witness_path(home, eval_run).mkdir(parents=True)
    assert EpochWitness(home, eval_run).read() == UNREADABLE
    desk = AdmissionDesk(client, eval_run, 2, home=home, recovery_hold_s=LONG_HOLD_S)
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(1, 0)
    assert refused.value.reason is RefusalReason.RECOVERING
    client.delete(*vars(desk.keys).values())


def test_a_lease_the_host_cannot_witness_is_refused(client: redis.Redis, home: Path) -> None:
    """When the witness cannot be made durable the lease is given back and refused
    no_witness; once the disk recovers, the next grant is witnessed and kept."""
    eval_run = _run()
    disk = Disk(failing=True)
    desk = AdmissionDesk(client, eval_run, 1, home=home, recovery_hold_s=LONG_HOLD_S)
    assert desk.witness is not None
    desk.witness.fsync = disk.fsync  # the witness's writes go through a failing disk
    with pytest.raises(AdmissionRefused) as refused:
        desk.acquire(1, 0)
    assert refused.value.reason is RefusalReason.NO_WITNESS
    stats = desk.stats()
    assert (stats["in_flight"], stats["acquired"], stats["released"], stats["refused"]) == (
        0,
        1,
        1,
        1,
    )
    assert EpochWitness(home, eval_run).read() is None
    assert disk.calls  # the refusal came from the failed fsync
    disk.failing = False
    lease = desk.acquire(2, 0)
    assert EpochWitness(home, eval_run).read() == lease.epoch
    assert desk.stats()["in_flight"] == 1
    client.delete(*vars(desk.keys).values())


def test_the_planner_desk_holds_as_long_as_a_request_can_stay_out(
    client: redis.Redis, home: Path
) -> None:
    """A planner's desk is held for its HTTP timeout plus the grace, witnessed under home;
    the job config's knob, when given, replaces that."""
    spec = OpenAIPlanner(
        kind="openai",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        prompt="p",
        request_timeout_s=5,
        admission_bound=3,
    )
    desk = admission_desk(client, spec, "run-a", home=home)
    assert desk.recovery_hold_s == http_timeout_s(spec) + RECOVERY_GRACE_S == 130.0
    assert desk.bound == 3 and desk.witness is not None
    assert desk.witness.path.parent == home / "admission"
    assert admission_desk(client, spec, "run-a", recovery_hold_s=0).recovery_hold_s == 0
    assert admission_desk(client, spec, "run-a").witness is None


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, None), ("", None), ("90", 90.0), ("0", 0.0), ("2.5", 2.5)]
)
def test_the_recovery_hold_knob(raw: str | None, expected: float | None) -> None:
    """SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S: unset means each planner's own; 0 is allowed."""
    env = {} if raw is None else {"SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S": raw}
    assert JobConfig.from_env(env).admission_recovery_hold_s == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "inf"])
def test_a_bad_recovery_hold_knob_is_named(raw: str) -> None:
    """A nonsense hold is a settings error naming the variable."""
    with pytest.raises(SettingsError, match="SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S"):
        JobConfig.from_env({"SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S": raw})
