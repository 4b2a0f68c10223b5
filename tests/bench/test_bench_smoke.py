"""The benchmark suite runs and reports its figures (never their values: no timing asserts)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.machine import cpu_after_sync, steal_share
from tests.bench.smoke import REPO, quick_run

# Every figure whose speed goal may be out of reach -> the figure its floor is measured
# as (None: the floor is the figure's own baseline arm).
FLOORED = {
    "pipeline.write_file": "pipeline.floor_noop_effect",
    "receipts.one_writer": "receipts.raw_dsync",
    "receipts.eight_slots": "receipts.raw_dsync_scaling",
    "detector.throughput": "detector.decode_floor",
}


@pytest.mark.timeout(300)
def test_quick_run_reports_numeric_ratios_and_floors(tmp_path: Path) -> None:
    """`bench.run --quick` of pipeline, receipts, detector exits 0, writes every figure of the
    first two with a ratio, and every figure with a speed goal with its floor beside it."""
    doc, text = quick_run(tmp_path, "pipeline,receipts,detector")
    assert doc["benchmarks_run"] == ["pipeline", "receipts", "detector"]
    assert {"nproc", "cpu_model", "python", "kernel", "date_utc"} <= doc["machine"].keys()
    names = set()
    for bench in ("pipeline", "receipts"):
        result = doc["results"][bench]
        assert result["error"] is None
        for figure in result["figures"]:
            names.add(figure["name"])
            assert isinstance(figure["ratio"], float)
            for side in ("subject", "baseline"):
                assert isinstance(figure[side]["ops_per_s"], float)
            if figure["goal"] is not None:
                assert isinstance(figure["met"], bool)
    assert {
        "pipeline.write_file",
        "receipts.one_writer",
        "receipts.eight_slots",
        "receipts.eight_processes",
        "receipts.lean_python",
        "receipts.lean_model",
    } <= names
    assert "## Machine" in text and "pipeline.write_file" in text
    assert isinstance(doc["machine"]["cpu_steal_share"], float)
    assert "| CPU stolen by the hypervisor during the run |" in text
    probe = doc["machine"]["cpu_after_sync"]
    assert f"| {probe['busy_us']} / {probe['after_sync_us']} µs (median; " in text
    assert_floors(doc, text)
    # What a receipt record costs in CPU, beside the eight-slot figure it bounds.
    notes = doc["results"]["receipts"]["notes"]
    assert any(n.startswith("CPU time per record, one writer") for n in notes), notes


def assert_floors(doc: dict[str, Any], text: str) -> None:
    figures = {f["name"]: f for r in doc["results"].values() for f in r["figures"]}
    assert doc["results"]["detector"]["error"] is None
    floored = dict(FLOORED)
    if not doc["machine"].get("jq"):  # the throughput figure is not measured without jq
        assert figures["detector.throughput"]["floor"] is None
        del floored["detector.throughput"]
    for name, floor_figure in floored.items():
        floor = figures[name]["floor"]
        assert floor is not None, name
        assert isinstance(floor["value"], float) and isinstance(floor["ratio"], float)
        assert floor["bound"] == 1.2 and isinstance(floor["within"], bool)
        if floor_figure is not None:
            assert floor["name"] == floor_figure
            assert isinstance(figures[floor_figure]["ratio"], float)
        bench = name.split(".")[0]
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {bench} | {name} |"))
        assert re.search(
            r"\*\*(not )?met\*\*; floor \S+ measured, figure at \S+x of the floor "
            r"\(within 1\.2x: (yes|no)\) \|$",
            row,
        ), row
    # The issue's own pipeline floor (the same call with a no-op effect) is the verdict's;
    # the stricter ones and the same pair in blocks of calls are in its note.
    note = figures["pipeline.write_file"]["floor"]["note"]
    for floor_name in ("pipeline.floor_with_effect", "pipeline.floor_two_fsync"):
        assert isinstance(figures[floor_name]["ratio"], float)
        assert floor_name in note
    assert "measured as blocks of calls" in note
    assert "called in turn" in figures["pipeline.write_file"]["floor"]["ratio_means"]
    assert "Where the time goes" in text and "| GET /healthz, no-op server |" in text
    # The receipts' floors also name the store's design floor: its system calls alone.
    for name, floor_name in (
        ("receipts.one_writer", "receipts.protocol_calls"),
        ("receipts.eight_slots", "receipts.protocol_calls_scaling"),
    ):
        assert isinstance(figures[floor_name]["ratio"], float)
        assert "against the protocol's system calls alone" in figures[name]["floor"]["note"]


def test_unknown_benchmark_is_a_usage_error() -> None:
    """Naming a benchmark that does not exist exits 2 and lists the known ones."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--only", "nosuch"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "nosuch" in proc.stderr and "pipeline" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_steal_share_is_the_hypervisors_part_of_the_hosts_cpu_time() -> None:
    """Of the CPU time between two /proc/stat readings, the part counted as steal."""
    start = [100, 0, 50, 800, 10, 0, 5, 35]
    end = [160, 0, 70, 900, 10, 0, 5, 55]  # 200 ticks in all, 20 of them stolen
    assert steal_share(start, end) == 0.1
    assert steal_share(None, end) is None and steal_share(start, start) is None


def test_the_cpu_after_sync_probe_times_the_same_work_both_ways(tmp_path: Path) -> None:
    """The host probe: medians of the same work in a busy loop and after a synced write,
    their ratio, and the probe's file gone after."""
    probe = cpu_after_sync(tmp_path, rounds=20)
    assert set(probe) == {"busy_us", "after_sync_us", "ratio"}
    assert probe["busy_us"] > 0 and probe["after_sync_us"] > 0
    assert probe["ratio"] == pytest.approx(probe["after_sync_us"] / probe["busy_us"], abs=0.01)
    assert list(tmp_path.iterdir()) == []
