"""ops.detect.verify: I1 and I2 over whole logs, the counts it checked, its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from ops.cli import ops
from ops.detect.detector import Incident, Kind, Malformed
from ops.detect.verify import verify
from ops.testing.synthlog import clean_log, synth_log
from runner.core import events
from tests.support.detectlog import lease_line, result_line, run_detect
from tests.support.repos import REPO
from tools.registry import MUTATING_TOOLS


def _independent_counts(path: Path) -> Counter[str]:
    """Leases, releases, applies and keys counted by a plain json.loads over every line."""
    counts: Counter[str] = Counter()
    keys = set()
    for raw in path.read_bytes().splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        event = obj.get("event")
        if event in (events.SLOT_LEASED, events.SLOT_RELEASED) and "generation" in obj:
            counts[event] += 1
        elif (
            event == events.TOOL_RESULT
            and obj.get("outcome") == events.OUTCOME_APPLIED
            and obj.get("tool") in MUTATING_TOOLS
        ):
            counts["applies"] += 1
            keys.add(obj["idempotency_key"])
    counts["keys"] = len(keys)
    return counts


def test_clean_log_holds_and_the_counts_are_what_was_checked(tmp_path: Path) -> None:
    """A clean log: I1 and I2 hold, and lines, leases, applies, keys match an independent count."""
    path = tmp_path / "log.jsonl"
    clean_log(path, 20_000, seed=11)
    proof = verify([str(path)])
    expect = _independent_counts(path)
    assert proof.holds and proof.exit_code == 0
    assert (proof.lines, proof.malformed) == (20_000, 0)
    assert proof.leases == expect[events.SLOT_LEASED]
    assert proof.releases == expect[events.SLOT_RELEASED]
    assert (proof.applies, proof.keys) == (expect["applies"], expect["keys"])
    assert proof.applies > 4_000


def test_injected_incidents_are_violations_of_the_same_kinds_detect_reports(tmp_path: Path) -> None:
    """Verify and detect share the timelines: on a generated log they count the same incidents."""
    path = tmp_path / "log.jsonl"
    synth = synth_log(path, 20_000, seed=12)
    proof = verify([str(path)])
    expected = Counter(kind for kind, _, _ in synth.expected)
    assert {k: n for k, n in proof.violations.items() if n} == dict(expected)
    assert proof.malformed == len(synth.malformed)
    assert proof.exit_code == 1
    found, _, _ = run_detect([str(path)])
    assert found == synth.expected


def test_apply_outside_the_lease_but_in_its_generation_violates_i1(tmp_path: Path) -> None:
    """Another attempt of the owner's job, or an apply after release, break I1 (not paged)."""
    path = tmp_path / "log.jsonl"
    lines = [
        lease_line("A", 1, attempt=2),
        result_line("A", 1, "A:1", attempt=2, receipt_job="A"),
        result_line("A", 1, "A:2", attempt=1, receipt_job="A"),
        lease_line("A", 1, released=True, attempt=2),
        result_line("A", 1, "A:3", attempt=2, receipt_job="A"),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    seen: list[Incident | Malformed] = []
    proof = verify([str(path)], seen.append)
    assert [(i.kind, i.line) for i in seen] == [(Kind.WRONG_ATTEMPT, 3), (Kind.AFTER_RELEASE, 5)]
    assert (proof.leases, proof.releases, proof.applies, proof.keys) == (1, 1, 3, 3)
    assert run_detect([str(path)])[0] == set()


def test_verify_parses_every_line_whatever_its_spelling(tmp_path: Path) -> None:
    """An apply whose outcome is written with a JSON escape still counts (no pre-filter)."""
    path = tmp_path / "log.jsonl"
    escaped = result_line("B", 1, "B:1").replace(b'"applied"', b'"appl\\u0069ed"')
    path.write_bytes(lease_line("A", 1) + b"\n" + escaped + b"\n")
    proof = verify([str(path)])
    assert proof.violations[Kind.CROSS_JOB] == 1 and proof.applies == 1


def test_json_output_and_exit_codes(tmp_path: Path) -> None:
    """--json lists violations then a summary; exit 0 holds, 1 violated, 2 unusable input."""
    clean, dirty = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl"
    clean_log(clean, 3_000, seed=13)
    synth = synth_log(dirty, 3_000, seed=14)
    runner = CliRunner()
    ok = runner.invoke(ops, ["verify", "--json", str(clean)])
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.stdout.splitlines()[-1])
    assert summary["kind"] == "summary" and summary["holds"] is True
    assert set(summary) >= {
        "lines",
        "malformed",
        "leases",
        "releases",
        "applies",
        "keys",
        "violations",
    }
    bad = runner.invoke(ops, ["verify", "--json", str(dirty)])
    assert bad.exit_code == 1
    *items, summary = [json.loads(line) for line in bad.stdout.splitlines()]
    violations = {(o["kind"], o["line"]) for o in items if o["kind"] != "malformed"}
    assert violations == {(k, n) for k, _, n in synth.expected}
    assert summary["holds"] is False and sum(summary["violations"].values()) == len(synth.expected)
    human = runner.invoke(ops, ["verify", str(clean)])
    assert human.exit_code == 0 and "I1 and I2 hold" in human.stdout
    missing = runner.invoke(ops, ["verify", str(clean), str(tmp_path / "gone.jsonl")])
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def test_module_entry_point_verify(tmp_path: Path) -> None:
    """python -m ops.cli verify: a real process gives 0, 1 and 2."""
    clean, dirty, binary = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl", tmp_path / "b.bin"
    clean_log(clean, 1_000, seed=15)
    synth_log(dirty, 2_000, seed=16)
    binary.write_bytes(bytes(range(1, 256)) * 20)

    def code(*paths: Path) -> int:
        argv = [sys.executable, "-m", "ops.cli", "verify", *map(str, paths)]
        return subprocess.run(
            argv, cwd=REPO, capture_output=True, check=False, timeout=120
        ).returncode

    assert (code(clean), code(dirty), code(binary)) == (0, 1, 2)
