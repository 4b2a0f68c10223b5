"""Restore: a job's snapshot goes back bit for bit; a live neighbour is never overwritten;
the job's slot is found in its receipts, archived or hot, when the log is gone."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from ops.detect.receipts_audit import last_slot_of
from ops.restore import RestoreError, restore
from runner.cli.main import main
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tools.receipts.archive import Archive
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore, Status


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}  # fmt: skip


@pytest.fixture
def one_slot(
    settings: Settings, tmp_path: Path
) -> tuple[Settings, SlotPool, Workspaces, Path, str]:
    settings = settings.with_(slots=1)
    repo = tmp_path / "repo"
    base = make_repo(repo)
    pool = SlotPool(settings, redis.Redis.from_url(settings.redis_url or "", decode_responses=True),
                    EventLog(settings))  # fmt: skip
    return settings, pool, Workspaces(settings.home), repo, base


def test_restore_into_the_slot_brings_back_the_start_tree(one_slot: tuple) -> None:  # type: ignore[type-arg]
    """A damaged tree in the victim's slot is put back to its start snapshot, bit for bit."""
    settings, pool, ws, repo, base = one_slot
    stamp = pool.lease("victim", 1)
    slot = settings.slots_dir / stamp.slot_id
    prepared = ws.prepare(slot, str(repo), base, "victim")
    (slot / "work" / "notes.txt").write_text("victim's own work\n")
    before = files(slot / "work")
    ws.snapshot(slot, "victim", "start")  # the start includes the victim's first edit
    # A cross-job write lands:
    (slot / "work" / "pkg" / "lock.py").write_text("held_by = 'intruder'\n")
    (slot / "work" / "intruder.txt").write_text("x")
    result = restore(settings, "victim")
    assert files(slot / "work") == before
    assert result.slot_id == stamp.slot_id and result.tree == ws.tree_of_dir(
        slot / "work", ws.cache_for(str(repo))
    )
    assert prepared.start_tree != ""


def test_restore_to_a_directory(one_slot: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """--to DIR writes the snapshot into a fresh directory and verifies the tree id."""
    settings, pool, ws, repo, base = one_slot
    stamp = pool.lease("job-1", 1)
    slot = settings.slots_dir / stamp.slot_id
    ws.prepare(slot, str(repo), base, "job-1")
    (slot / "work" / "added.txt").write_text("end state\n")
    _, end_tree = ws.snapshot(slot, "job-1", "end")
    result = restore(settings, "job-1", which="end", to=tmp_path / "out")
    assert result.tree == end_tree
    assert files(tmp_path / "out") == files(slot / "work")


def test_restore_refuses_a_slot_held_by_another_live_job(one_slot: tuple) -> None:  # type: ignore[type-arg]
    """The victim's slot now belongs to a live job: refused without --force, tree untouched."""
    settings, pool, ws, repo, base = one_slot
    first = pool.lease("victim", 1)
    slot = settings.slots_dir / first.slot_id
    ws.prepare(slot, str(repo), base, "victim")
    pool.release(first.slot_id, "victim", first.generation)
    pool.lease("neighbour", 1)
    ws.prepare(slot, str(repo), base, "neighbour")
    (slot / "work" / "neighbour.txt").write_text("mine\n")
    before = files(slot / "work")
    with pytest.raises(RestoreError, match="leased to live job neighbour"):
        restore(settings, "victim")
    assert files(slot / "work") == before


def test_unknown_job_is_a_clear_error(settings: Settings) -> None:
    """A job with no snapshot is named in the error."""
    with pytest.raises(RestoreError, match="no 'start' snapshot for job 'ghost'"):
        restore(settings, "ghost")


def victim_receipt(slot: Path, slot_id: str, generation: int) -> None:
    store = ReceiptStore(slot)
    began = store.begin(key="victim:a1:s0:write_file", job_id="victim", attempt=1,
                        slot_id=slot_id, generation=generation, tool="write_file")  # fmt: skip
    store.finish(began.receipt, Status.APPLIED, digest="d")
    store.close()


def test_restore_finds_the_slot_through_the_receipt_archive_when_the_log_is_gone(
    one_slot: tuple,  # type: ignore[type-arg]
) -> None:
    """The log rotated away and the next lease archived the victim's receipts: the
    archive's index still names the victim's slot."""
    settings, pool, ws, repo, base = one_slot
    first = pool.lease("victim", 1)
    slot = settings.slots_dir / first.slot_id
    ws.prepare(slot, str(repo), base, "victim")
    victim_receipt(slot, first.slot_id, first.generation)
    (slot / "work" / "notes.txt").write_text("victim's own work\n")
    before = files(slot / "work")
    ws.snapshot(slot, "victim", "start")
    pool.release(first.slot_id, "victim", first.generation)
    nxt = pool.lease("next", 1)  # rotates the victim's receipts into the archive
    pool.release(nxt.slot_id, "next", nxt.generation)
    assert b"victim" not in (slot / RECEIPTS_FILE).read_bytes()
    assert len(Archive(slot).segments()) == 1
    settings.log_path.unlink()
    (slot / "work" / "notes.txt").write_text("overwritten\n")
    result = restore(settings, "victim")
    assert result.slot_id == first.slot_id
    assert files(slot / "work") == before


def test_the_slot_that_named_the_job_last_wins(tmp_path: Path) -> None:
    """The job's receipts in two slots: the one with its latest record, rotated or hot."""
    slots = tmp_path / "slots"
    ticks = iter(range(10))

    def clock() -> datetime:
        return datetime(2030, 1, 1, 0, 0, next(ticks), tzinfo=UTC)

    for slot_id in ("S0", "S1"):
        (slots / slot_id).mkdir(parents=True)
    for slot_id, rotate in (("S1", True), ("S0", True), ("S1", False)):
        store = ReceiptStore(slots / slot_id, clock)
        began = store.begin(key=f"k-{next(ticks)}", job_id="victim", attempt=1,
                            slot_id=slot_id, generation=1, tool="write_file")  # fmt: skip
        store.finish(began.receipt, Status.APPLIED)
        if rotate:
            assert store.rotate() == 1
        assert last_slot_of(slots, "victim") == (slot_id, [])
        store.close()
    assert last_slot_of(slots, "nobody") == (None, [])


def test_no_log_and_no_receipts_is_a_clear_error(one_slot: tuple) -> None:  # type: ignore[type-arg]
    """A snapshot exists but neither the log nor any receipt names the job's slot."""
    settings, pool, ws, repo, base = one_slot
    stamp = pool.lease("victim", 1)
    ws.prepare(settings.slots_dir / stamp.slot_id, str(repo), base, "victim")
    ws.snapshot(settings.slots_dir / stamp.slot_id, "victim", "start")
    settings.log_path.unlink()
    with pytest.raises(RestoreError, match=r"neither .*slotrunner\.jsonl nor the receipts under"):
        restore(settings, "victim")
    verb = CliRunner().invoke(main, ["ops", "restore", "victim"], env=settings.to_env())
    assert verb.exit_code == 2
    assert "error: job 'victim' never leased a slot on this host" in verb.output
    assert "Traceback" not in verb.output
