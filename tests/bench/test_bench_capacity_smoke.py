"""The capacity benchmark's quick run (bench/capacity.py): structure only, no timing asserts.
A file of its own, so the suite runs it beside the other smoke runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import REPO, quick_run


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
