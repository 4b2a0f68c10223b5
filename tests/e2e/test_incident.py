"""End to end: an unfenced cross-job write is paged, the pool stops, restore repairs it."""

from __future__ import annotations

from pathlib import Path

from ops.demo.incident import run


def test_unfenced_replay_is_paged_pool_stopped_and_restored(tmp_path: Path) -> None:
    """Fence off: the write lands, a page arrives, the worker stops consuming, and the
    victim's tree is restored bit for bit. Fence on: refused 409, nothing paged."""
    off, on = run(tmp_path)
    assert off.replay_status == 200 and off.victim_intact is False
    kinds = {page["labels"]["alertname"] for page in off.pages}
    assert kinds & {"slotrunner_cross_job_apply", "slotrunner_stale_generation_apply"}
    assert off.pool_stopped, off.pages
    assert off.still_consuming == []  # no worker takes jobs from the queue any more
    assert off.restored_tree == off.start_tree
    assert off.restored_bytes_equal is True
    assert on.replay_status == 409 and on.victim_intact is True
    assert on.pages == []
    assert on.still_consuming  # nothing paged, nothing stopped: the worker still consumes
