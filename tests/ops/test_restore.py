"""Restore: a job's snapshot goes back bit for bit; a live neighbour is never overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from ops.restore import RestoreError, restore
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo


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
