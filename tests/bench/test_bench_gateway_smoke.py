"""The gateway benchmark's quick run (bench/gateway.py): structure only, no timing asserts.
A file of its own, so the suite runs it beside the other smoke runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.smoke import quick_run


@pytest.mark.timeout(300)
def test_quick_gateway_reports_both_percentiles_with_the_bare_proxy_floor(tmp_path: Path) -> None:
    """`bench.run --quick --only gateway`: p50 and p99 against the direct call, each with
    its verdict and the floor of a proxy hop that does nothing else beside it."""
    doc, text = quick_run(tmp_path, "gateway")
    result = doc["results"]["gateway"]
    assert result["error"] is None
    figures = {figure["name"]: figure for figure in result["figures"]}
    for q in ("p50", "p99"):
        figure = figures[f"gateway.{q}"]
        assert isinstance(figure["ratio"], float) and isinstance(figure["met"], bool)
        floor = figure["floor"]
        assert floor["name"] == "gateway.floor_proxy" and floor["bound"] == 1.2
        assert isinstance(floor["value"], float) and isinstance(floor["within"], bool)
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| gateway | gateway.{q} |"))
        assert re.search(r"floor \S+ measured, figure at \S+x of the floor", row), row
    assert re.search(r"a bare proxy hop \(the floor\) p50 [\d.]+ ms, p99 [\d.]+ ms", text)
