"""The benchmark suite runs and reports its figures (never their values: no timing asserts)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# Every figure whose speed goal may be out of reach -> the figure its floor is measured
# as (None: the floor is the figure's own baseline arm).
FLOORED = {
    "pipeline.write_file": "pipeline.floor_with_effect",
    "receipts.one_writer": None,
    "receipts.eight_slots": "receipts.raw_scaling",
    "detector.throughput": "detector.decode_floor",
}


def quick_run(tmp_path: Path, only: str) -> tuple[dict[str, Any], str]:
    """`bench.run --quick --only ONLY`, which must exit 0: its JSON document and Markdown."""
    out, md = tmp_path / "results.json", tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", only,
         "--json-out", str(out), "--md-out", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), md.read_text()


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
    assert {"pipeline.write_file", "receipts.one_writer", "receipts.eight_slots"} <= names
    assert "## Machine" in text and "pipeline.write_file" in text
    assert_floors(doc, text)


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
    assert "pipeline.floor_two_fsync" in figures
    assert "Where the time goes" in text and "| GET /healthz, no-op server |" in text


def test_unknown_benchmark_is_a_usage_error() -> None:
    """Naming a benchmark that does not exist exits 2 and lists the known ones."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--only", "nosuch"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "nosuch" in proc.stderr and "pipeline" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(300)
def test_quick_capacity_reports_every_point_and_both_knees(tmp_path: Path) -> None:
    """`bench.run --quick --only capacity` reports each C and S, the ratios, the knees, no plot."""
    plot = REPO / "bench" / "capacity.png"
    plot_before = plot.stat().st_mtime_ns if plot.exists() else None
    doc, text = quick_run(tmp_path, "capacity")
    result = doc["results"]["capacity"]
    assert result["error"] is None
    figures = {figure["name"]: figure for figure in result["figures"]}
    for c in (1, 2, 4, 8, 16):
        point = figures[f"capacity.calls@C={c}"]
        assert isinstance(point["ratio"], float) and point["goal"] is None
        for side in ("subject", "baseline"):
            assert {"ops_per_s", "p50_ms", "p99_ms", "server_cores", "client_cores"} <= set(
                point[side]
            )
    for s in (1, 2, 4, 8):
        point = figures[f"capacity.jobs@S={s}"]
        assert isinstance(point["ratio"], float) and point["goal"] is None
        assert {"ops_per_s", "p50_ms", "server_cores", "worker_cores"} <= set(point["subject"])
    for name, arms, levels in (
        ("capacity.calls.knee", ("tool server", "no-op server"), (1, 2, 4, 8, 16)),
        ("capacity.jobs.knee", ("pool",), (1, 2, 4, 8)),
    ):
        knee = figures[name]
        assert knee["goal"] is None and knee["met"] is None
        assert knee["value"] is None or knee["value"] in levels[:-1]
        assert knee["subject"]["why_at"] in levels
        for arm in arms:
            assert f"{arm}: knee " in knee["note"]
    assert "### capacity.calls\n" in text and "| C=16 | baseline |" in text
    assert "### capacity.jobs\n" in text and "| S=8 | subject |" in text
    assert "capacity.png" in text
    assert (plot.stat().st_mtime_ns if plot.exists() else None) == plot_before


@pytest.mark.timeout(300)
def test_quick_history_reports_every_size_its_ratios_and_the_oldest_receipt(
    tmp_path: Path,
) -> None:
    """`bench.run --quick --only history` reports each measure's ratio to a fresh slot with
    its verdict, both slots at every size, every oldest-key lookup answered 200, no plot."""
    plot = REPO / "bench" / "history.png"
    untouched = plot.stat().st_mtime_ns if plot.exists() else None
    doc, text = quick_run(tmp_path, "history")
    figures = {figure["name"]: figure for figure in doc["results"]["history"]["figures"]}
    assert doc["results"]["history"]["error"] is None
    for name in ("start_s", "rss_mb", "call_ms", "lookup_ms", "lookup_old_ms"):
        figure = figures[f"history.{name}"]
        assert isinstance(figure["ratio"], float) and isinstance(figure["met"], bool)
        assert figure["goal"]["threshold"] == 1.2
    assert isinstance(figures["history.hot_file_mb"]["ratio"], float)
    for side in ("subject", "baseline"):
        old_key = figures["history.lookup_old_ms"][side]
        assert old_key["answered_200"] == old_key["runs"] * old_key["ops_per_run"]
    for size in ("1,000", "10,000"):
        assert re.search(rf"^\| {size} \| old: [\d,]+ records, [\d,]+ generations \|", text, re.M)
        assert f"\n| {size} | fresh |" in text
    assert (plot.stat().st_mtime_ns if plot.exists() else None) == untouched
