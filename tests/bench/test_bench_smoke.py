"""The benchmark suite runs and reports its figures (never their values: no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


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
def test_quick_run_reports_numeric_ratios(tmp_path: Path) -> None:
    """`bench.run --quick --only pipeline,receipts` exits 0 and writes every figure with a ratio."""
    doc, text = quick_run(tmp_path, "pipeline,receipts")
    assert doc["benchmarks_run"] == ["pipeline", "receipts"]
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
