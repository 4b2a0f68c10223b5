"""The benchmark suite runs and reports its figures (never their values: no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_run_reports_numeric_ratios(tmp_path: Path) -> None:
    """`bench.run --quick --only pipeline,receipts` exits 0 and writes every figure with a ratio."""
    out, md = tmp_path / "results.json", tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", "pipeline,receipts",
         "--json-out", str(out), "--md-out", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
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
    text = md.read_text()
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
