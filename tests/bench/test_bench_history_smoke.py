"""The history benchmark's quick run (bench/history.py): structure only, no timing asserts.
A file of its own, so the suite runs it beside the other smoke runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.smoke import REPO, quick_run


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


@pytest.mark.timeout(300)
def test_quick_follow_reports_the_restarted_followers_memory_at_every_size(
    tmp_path: Path,
) -> None:
    """`bench.run --quick --only follow` judges the restarted follower's VmHWM against a
    fresh one's and tables every size (each follower found the repeated first key, or
    the benchmark would have failed)."""
    doc, text = quick_run(tmp_path, "follow")
    result = doc["results"]["follow"]
    assert result["error"] is None
    (figure,) = result["figures"]
    assert figure["name"] == "follow.rss_mb" and isinstance(figure["met"], bool)
    assert figure["goal"]["threshold"] == 1.2
    for size in ("1e+03", "1e+05"):
        assert re.search(rf"^\| {re.escape(size)} \| \d+ \|", text, re.M)
