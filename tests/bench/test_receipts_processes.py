"""The receipts benchmark's process arm runs whatever the bench process did before it."""

from __future__ import annotations

import multiprocessing.util
import os
from pathlib import Path

import pytest

from bench.receipts import _processes


class _Library:
    """Something a library keeps that it cleans up in forked workers (as kombu's pools)."""


@pytest.mark.timeout(120)
def test_the_process_arm_runs_no_after_fork_handler_of_the_bench_process(tmp_path: Path) -> None:
    """kombu registers an after-fork handler that closes pooled broker connections; in a
    forked writer it hung on one waiting in BRPOP. The handler here ends a child at once
    instead: run in the writers, they would die and the arm would never finish."""
    jobs = []
    for index in range(2):
        slot_dir = tmp_path / f"slot-{index}"
        slot_dir.mkdir()
        jobs.append((slot_dir, f"w{index}"))
    library = _Library()
    multiprocessing.util.register_after_fork(library, lambda _: os._exit(7))
    try:
        run = _processes(jobs, 20)
    finally:
        del library  # the registry holds it weakly: gone, it is never called again
    assert run.ops == 40  # two writers, ten begin+finish pairs each: 40 records
    for slot_dir, _ in jobs:
        assert (slot_dir / "receipts.jsonl").read_bytes().count(b"\n") == 20


@pytest.mark.timeout(120)
def test_a_writer_process_that_fails_names_its_error(tmp_path: Path) -> None:
    """A writer whose slot directory does not exist fails the arm with the store's own
    error on one line, and no writer is left running."""
    good = tmp_path / "slot-0"
    good.mkdir()
    with pytest.raises(
        RuntimeError, match=r"store writer process failed: FileNotFoundError: .*slot-1"
    ):
        _processes([(good, "w0"), (tmp_path / "slot-1", "w1")], 20)
    # The writer that did start wrote its pairs and ended: nothing is left waiting.
    assert (good / "receipts.jsonl").read_bytes().count(b"\n") == 20
