"""bench.chaos_sweep: seeds parsed, tables rebuilt from reports, the Findings prose kept."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from bench.chaos_sweep import compose, keep_findings, parse_seeds, render


def test_parse_seeds() -> None:
    assert parse_seeds("1-3,7") == [1, 2, 3, 7]
    with pytest.raises(click.BadParameter, match="x"):
        parse_seeds("x")


def _report(ok: bool, skipped: bool) -> dict[str, object]:
    return {
        "ok": ok,
        "jobs": 2,
        "faults_injected": 1,
        "faults_skipped": int(skipped),
        "states": {"succeeded": 2},
        "duplicate_applies": 0,
        "toolserver_restarts": 0,
        "worker_restarts": ["w1: boom"],
        "duration_s": 4.0,
        "jobs_per_s": 0.5,
        "fired": [{"kind": "redis_wipe", "skipped": False}]
        + ([{"kind": "pause", "skipped": True}] if skipped else []),
        "checks": [
            {"name": "ops_verify", "ok": ok, "data": {"counts": {"duplicate_apply": 0}}},
            {"name": "final_trees", "ok": ok, "data": {}},
        ],
    }


def test_render_counts_what_the_reports_say(tmp_path: Path) -> None:
    for seed, ok in ((1, True), (2, False)):
        (tmp_path / str(seed)).mkdir()
        (tmp_path / str(seed) / "report.json").write_text(json.dumps(_report(ok, not ok)))
    runs = [{"seed": 1, "exit": 0, "wall_s": 5}, {"seed": 2, "exit": 1, "wall_s": 6}]
    text = render(runs, tmp_path, 2, "2026-01-01T00:00:00Z")
    assert "seeds passing every check: **1 of 2**" in text
    assert "| redis_wipe | 2 | 0 |" in text and "| pause | 0 | 1 |" in text
    assert "| succeeded | 4 |" in text
    assert "- seed 2: ops_verify, final_trees" in text
    assert "wall time of the whole sweep: 11 s" in text


def test_findings_are_kept_verbatim() -> None:
    doc = "# old tables\n\n## Findings\n\nprose *kept*\n"
    assert keep_findings(doc) == "## Findings\n\nprose *kept*\n"
    assert keep_findings("no heading").startswith("## Findings")


def test_a_sweep_on_several_hosts_replaces_only_its_own_section() -> None:
    """One host's tables, the Several hosts section and the Findings each survive the
    other sweep's rewrite."""
    doc = "# one host\n\nold 1\n\n## Findings\n\nprose\n"
    both = compose(doc, "## Several hosts: seeds 1..2\n\nold 3\n", hosts=3)
    assert (
        both
        == "# one host\n\nold 1\n\n## Several hosts: seeds 1..2\n\nold 3\n\n## Findings\n\nprose\n"
    )
    again = compose(both, "# one host\n\nnew 1\n", hosts=1)
    assert "new 1" in again and "old 1" not in again and "old 3" in again
    three = compose(again, "## Several hosts: seeds 1..10\n\nnew 3\n", hosts=3)
    assert "new 3" in three and "old 3" not in three and "new 1" in three
    assert three.endswith("## Findings\n\nprose\n")
