"""The MCP benchmark's quick run (bench/mcp_call.py): structure only, no timing asserts.
A file of its own, so the suite runs it beside the other smoke runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.smoke import quick_run


@pytest.mark.timeout(300)
def test_quick_mcp_reports_its_ratio_and_the_packages_floor(tmp_path: Path) -> None:
    """`bench.run --quick --only mcp`: the MCP call against the HTTP call with its verdict,
    and the floor (the HTTP call + what the mcp package adds doing nothing) beside it."""
    doc, text = quick_run(tmp_path, "mcp")
    result = doc["results"]["mcp"]
    assert result["error"] is None
    figures = {figure["name"]: figure for figure in result["figures"]}
    figure = figures["mcp.write_file"]
    assert isinstance(figure["ratio"], float) and isinstance(figure["met"], bool)
    floor = figure["floor"]
    assert floor["name"] == "mcp.floor_package" and floor["bound"] == 1.2
    assert isinstance(floor["value"], float) and floor["value"] >= 1.0  # never below HTTP
    assert isinstance(floor["within"], bool)
    assert isinstance(figures["mcp.floor_package"]["ratio"], float)
    assert re.search(r"no-op MCP call p50 [\d.]+ ms, no-op HTTP POST p50 [\d.]+ ms", text)
