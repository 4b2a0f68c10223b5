"""ops.detect.detector: rules, reader, CLI, and a generated log of every incident kind."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from ops.cli import ops
from ops.detect.detector import (
    DETECT_KINDS,
    Apply,
    Kind,
    Lease,
    Malformed,
    Replay,
    SlotState,
    judge_apply,
    parse_line,
)
from ops.testing.synthlog import MUTATING, clean_log, synth_log
from runner.core import events
from tests.support.detectlog import lease_line, log_line, result_line, run_detect
from tests.support.repos import REPO


def _kinds_by_line(tmp_path: Path, lines: list[bytes]) -> dict[int, set[str]]:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    found, _, _ = run_detect([str(path)])
    out: dict[int, set[str]] = {}
    for kind, _, line in found:
        out.setdefault(line, set()).add(kind)
    return out


# -- the rules ----------------------------------------------------------------------


def _apply(gen: int = 3, job: str = "A", attempt: int = 1, receipt_job: str | None = "A") -> Apply:
    return Apply("h1", "S1", gen, job, attempt, "apply_patch", "k", receipt_job, "t", "log", 1)


LEASED = SlotState(3, "A", 1, leased=True, released=False)


@pytest.mark.parametrize(
    ("slot", "apply", "kind"),
    [
        (LEASED, _apply(), None),
        (LEASED, _apply(receipt_job=None), None),
        (None, _apply(), Kind.UNOWNED),
        (LEASED, _apply(gen=4), Kind.UNOWNED),
        (SlotState(3, "A", 1, leased=False, released=True), _apply(), Kind.UNOWNED),
        (LEASED, _apply(job="B", receipt_job="B"), Kind.CROSS_JOB),
        (LEASED, _apply(receipt_job="B"), Kind.CROSS_JOB),
        (None, _apply(receipt_job="B"), Kind.CROSS_JOB),
        (LEASED, _apply(gen=4, receipt_job="B"), Kind.CROSS_JOB),
        (LEASED, _apply(gen=2), Kind.STALE),
        (LEASED, _apply(gen=2, job="B", receipt_job="C"), Kind.STALE),
        (LEASED, _apply(attempt=2), Kind.WRONG_ATTEMPT),
        (LEASED._replace(released=True), _apply(), Kind.AFTER_RELEASE),
        (LEASED._replace(released=True), _apply(job="B", receipt_job="B"), Kind.CROSS_JOB),
    ],
)
def test_judge_apply_verdicts_and_precedence(
    slot: SlotState | None, apply: Apply, kind: Kind | None
) -> None:
    """Each ownership verdict, with stale > cross_job > unowned when several apply."""
    assert judge_apply(slot, apply) == kind


def test_timeline_follows_leases_and_ignores_late_older_generations() -> None:
    """A lease sets the owner, a release marks it, a line of an older generation changes nothing."""
    replay = Replay()
    replay.lease(Lease(False, "h1", "S1", 5, "A", 1, "t", "log", 1))
    replay.lease(Lease(False, "h1", "S1", 4, "Z", 1, "t", "log", 2))
    assert replay.slots[("h1", "S1")] == SlotState(5, "A", 1, leased=True, released=False)
    replay.lease(Lease(True, "h1", "S1", 4, "Z", 1, "t", "log", 3))
    assert replay.slots[("h1", "S1")].released is False
    replay.lease(Lease(True, "h1", "S1", 5, "A", 1, "t", "log", 4))
    assert replay.slots[("h1", "S1")] == SlotState(5, "A", 1, leased=True, released=True)
    replay.lease(Lease(True, "h1", "S2", 7, "B", 2, "t", "log", 5))
    assert replay.slots[("h1", "S2")] == SlotState(7, "B", 2, leased=False, released=True)


def test_buffered_replay_is_stale_and_duplicate_and_replayed_lines_never_count(
    tmp_path: Path,
) -> None:
    """A buffered replay (old envelope, same key) is two incidents; a 'replayed' line is none."""
    found = _kinds_by_line(
        tmp_path,
        [
            lease_line("A", 1),
            result_line("A", 1, "A:1"),
            result_line("A", 1, "A:1", outcome=events.OUTCOME_REPLAYED, receipt_job="A"),
            lease_line("A", 1, released=True),
            lease_line("B", 2),
            result_line("A", 1, "A:1", receipt_job="A"),
            result_line("B", 2, "B:1", outcome=events.OUTCOME_REFUSED, reason="stale_generation"),
            result_line("B", 2, "B:2", tool="read_file", outcome=events.OUTCOME_APPLIED),
        ],
    )
    assert found == {6: {Kind.STALE, Kind.DUPLICATE}}


def test_same_slot_id_on_two_hosts_are_two_timelines(tmp_path: Path) -> None:
    """S1 leased at generation 9 on h2 does not make h1's S1 generation 2 stale."""
    found = _kinds_by_line(
        tmp_path,
        [
            lease_line("A", 2, host="h1"),
            lease_line("B", 9, host="h2"),
            result_line("A", 2, "A:1", host="h1"),
            result_line("B", 9, "B:1", host="h2"),
            result_line("B", 9, "B:2", host="h1"),
        ],
    )
    assert found == {5: {Kind.UNOWNED}}


@pytest.mark.parametrize(
    "raw",
    [
        result_line("A", 1, "k")[:60],  # torn
        b'\xff\xfe\x00 "applied" \x9c',  # binary
        b'["tool_result", "applied"]',  # not an object
        b'"applied"',
        json.dumps(
            {
                "event": "slot_leased",
                "host": "h1",
                "ts": "t",
                "slot_id": "S1",
                "job_id": "A",
                "attempt": 1,
            }
        ).encode(),  # no generation
        result_line("A", 1, "k").replace(b'"host": "h1", ', b""),
        result_line("A", 1, "k").replace(b'"slot_generation": 1', b'"slot_generation": true'),
        result_line("A", 1, "k").replace(b'"idempotency_key": "k"', b'"idempotency_key": ""'),
        result_line("A", 1, "k").replace(b'"service_ms": 1.0, ', b""),
        lease_line("A", 1).replace(b'"attempt": 1', b'"attempt": "1"'),
    ],
)
def test_parse_line_marks_malformed_lines(raw: bytes) -> None:
    """Torn, binary, non-object, missing-field and mistyped lines are malformed, never raise."""
    assert isinstance(parse_line(raw, "log", 7), Malformed)


@pytest.mark.parametrize(
    "raw",
    [
        result_line("A", 1, "k", outcome=events.OUTCOME_REPLAYED),
        result_line("A", 1, "k", tool="read_file"),
        result_line("A", 1, "k", outcome=events.OUTCOME_REFUSED, reason="applied"),
        log_line(events.JOB_FINISHED, note="applied"),
    ],
)
def test_parse_line_ignores_lines_that_are_not_applies(raw: bytes) -> None:
    """Replays, read-only tools, refusals and other events are no record for the rules."""
    assert parse_line(raw, "log", 1) is None


def test_blank_lines_are_skipped_and_other_shapes_counted(tmp_path: Path) -> None:
    """Blank and CRLF lines are fine; a non-object line that names no candidate is malformed."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(
        lease_line("A", 1) + b"\r\n\n   \n" + b"plain text\n" + log_line("job_started") + b"\n"
    )
    _, malformed, _ = run_detect([str(path)])
    assert malformed == {(str(path), 4)}


# -- whole logs -----------------------------------------------------------------------


def test_every_incident_for_every_tool_is_reported_exactly(tmp_path: Path) -> None:
    """Every incident for every mutating tool, twice (first and last line too), torn lines
    and binary garbage: exactly the injected incidents and garbage. The same check on
    1,000,000 lines is a measurement in bench/detector.py (``detector.exact``)."""
    path = tmp_path / "log.jsonl"
    synth = synth_log(path, 20_000, rounds=2, seed=1)
    found, malformed, incidents = run_detect([str(path)])
    assert synth.lines[str(path)] == 20_000
    assert found == synth.expected
    assert malformed == synth.malformed
    assert (Kind.UNOWNED, str(path), 1) in found
    assert (Kind.CROSS_JOB, str(path), 20_000) in found
    assert {(i.kind, i.tool) for i in incidents} == {(k, t) for k in DETECT_KINDS for t in MUTATING}


def test_gzip_and_glob_inputs_read_like_plain_files(tmp_path: Path) -> None:
    """A .gz copy (sniffed by magic) and a glob find the same incidents as the plain file."""
    path = tmp_path / "log.jsonl"
    synth = synth_log(path, 5_000, seed=4)
    gz = tmp_path / "old.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    found, malformed, _ = run_detect([str(gz)])
    assert found == {(k, str(gz), n) for k, _, n in synth.expected}
    assert malformed == {(str(gz), n) for _, n in synth.malformed}
    found, _, _ = run_detect([str(tmp_path / "l*.jsonl")])
    assert found == synth.expected


def test_files_are_merged_by_ts_before_the_timelines_replay(tmp_path: Path) -> None:
    """Leases in one file and tool results in another find what the single file finds."""
    path = tmp_path / "log.jsonl"
    synth = synth_log(path, 20_000, seed=5, garbage=False)
    leases, tools = tmp_path / "leases.jsonl", tmp_path / "tools.jsonl"
    with open(leases, "wb") as fl, open(tools, "wb") as ft:
        for line in path.read_bytes().splitlines(keepends=True):
            (ft if b'"tool_result"' in line else fl).write(line)
    _, _, whole = run_detect([str(path)])
    _, _, split = run_detect([str(tools), str(leases)])
    assert Counter((i.kind, i.ts) for i in split) == Counter((i.kind, i.ts) for i in whole)
    assert len(whole) == len(synth.expected)


def test_per_host_files_find_every_injected_incident(tmp_path: Path) -> None:
    """One file per host, read together: every incident at its own file and line."""
    synth = synth_log(tmp_path / "log.jsonl", 10_000, per_host=True, seed=6)
    found, malformed, _ = run_detect(sorted(set(synth.paths.values())))
    assert found == synth.expected
    assert malformed == synth.malformed


# -- the jq|awk alert (docs/architecture.md §Log records) -------------------------------

JQ_ALERT = (
    'jq -r \'select(.tool=="apply_patch") | [.job_id,.slot_generation,.receipt_job] '
    "| @tsv' \"$0\" | awk -F'\\t' '$1 != $3 { print }'"
)


def _jq_alert(path: Path) -> tuple[int, set[tuple[str, ...]]]:
    assert shutil.which("jq"), "jq is needed for this comparison: apt-get install -y jq"
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", JQ_ALERT, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, {tuple(row.split("\t")) for row in proc.stdout.splitlines()}


def test_detector_finds_what_the_jq_alert_flags_and_what_it_cannot(tmp_path: Path) -> None:
    """Every real incident the jq|awk alert prints is found; so are the stale,
    unowned, duplicate and other-tool ones it cannot see, and past a garbage line."""
    path = tmp_path / "clean.jsonl"
    synth = synth_log(path, 30_000, seed=7, garbage=False, keep_meta=True)
    code, rows = _jq_alert(path)
    assert code == 0

    def row(where: tuple[str, int]) -> tuple[str, ...]:
        m = synth.meta[where]
        return (str(m["job_id"]), str(m["slot_generation"]), str(m.get("receipt_job") or ""))

    real = {
        row(w)
        for w, m in synth.meta.items()
        if m.get("tool") == "apply_patch"
        and m.get("outcome") == "applied"
        and m.get("receipt_job") not in (None, m["job_id"])
    }
    found, _, incidents = run_detect([str(path)])
    assert found == synth.expected
    seen_by_detector = {row((i.path, i.line)) for i in incidents}
    assert rows & real == real and real <= seen_by_detector
    assert rows - real, "the pipeline also flags lines that are no incident (refusals, no receipt)"
    unseen = {i.kind for i in incidents if row((i.path, i.line)) not in rows}
    assert {Kind.STALE, Kind.UNOWNED, Kind.DUPLICATE, Kind.CROSS_JOB} <= unseen

    dirty = tmp_path / "dirty.jsonl"
    synth = synth_log(dirty, 30_000, seed=7)
    code, _ = _jq_alert(dirty)
    assert code != 0  # jq stops at the first line it cannot parse
    found, _, _ = run_detect([str(dirty)])
    assert found == synth.expected


# -- the CLI ------------------------------------------------------------------------------

INCIDENT_KEYS = {
    "kind",
    "path",
    "line",
    "job_id",
    "slot_id",
    "generation",
    "tool",
    "idempotency_key",
    "host",
    "ts",
}


def test_json_output_is_one_object_per_incident_then_a_summary(tmp_path: Path) -> None:
    """--json: incidents and malformed lines as objects, the summary last with counts by kind."""
    path = tmp_path / "log.jsonl"
    synth = synth_log(path, 3_000, seed=8)
    result = CliRunner().invoke(ops, ["detect", "--json", str(path)])
    assert result.exit_code == 1, result.output
    objs = [json.loads(line) for line in result.stdout.splitlines()]
    *items, summary = objs
    incidents = [o for o in items if o["kind"] != "malformed"]
    assert all(set(o) == INCIDENT_KEYS for o in incidents)
    assert {(o["kind"], o["path"], o["line"]) for o in incidents} == synth.expected
    assert {(o["path"], o["line"]) for o in items if o["kind"] == "malformed"} == synth.malformed
    assert summary == {
        "kind": "summary",
        "lines": 3_000,
        "malformed": len(synth.malformed),
        "incidents": {k: sum(1 for e in synth.expected if e[0] == k) for k in DETECT_KINDS},
    }


def test_exit_codes_clean_incidents_and_unusable(tmp_path: Path) -> None:
    """0 on a clean log, 1 on incidents, 2 on a missing file, a binary file, an empty glob."""
    clean, dirty, binary = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl", tmp_path / "x.bin"
    clean_log(clean, 2_000)
    synth_log(dirty, 2_000)
    binary.write_bytes(bytes(range(256)) * 50)
    runner = CliRunner()
    assert runner.invoke(ops, ["detect", str(clean)]).exit_code == 0
    human = runner.invoke(ops, ["detect", str(dirty)])
    assert human.exit_code == 1 and "cross_job_apply" in human.stdout
    for bad, message in [
        (tmp_path / "nope.jsonl", "no such file"),
        (binary, "not a slotrunner log"),
        (tmp_path / "none-*.jsonl", "no such file"),
    ]:
        result = runner.invoke(ops, ["detect", str(clean), str(bad)])
        assert result.exit_code == 2 and str(bad) in result.stderr and message in result.stderr


def test_module_entry_point_exit_codes_and_stdin(tmp_path: Path) -> None:
    """python -m ops.cli detect: 0, 1, 2 as a real process, and '-' reads stdin."""
    clean, dirty = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl"
    clean_log(clean, 1_000)
    synth = synth_log(dirty, 2_000, seed=9)

    def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "ops.cli", "detect", *args],
            cwd=REPO,
            input=stdin,
            capture_output=True,
            check=False,
            timeout=120,
        )

    assert run(str(clean)).returncode == 0
    assert run(str(dirty)).returncode == 1
    missing = run(str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 2 and b"no such file" in missing.stderr
    assert b"Traceback" not in missing.stderr
    piped = run("--json", "-", stdin=dirty.read_bytes())
    assert piped.returncode == 1
    objs = [json.loads(line) for line in piped.stdout.splitlines()]
    got = {(o["kind"], o["line"]) for o in objs if o["kind"] in DETECT_KINDS}
    assert got == {(k, n) for k, _, n in synth.expected}
    assert all(o["path"] == "<stdin>" for o in objs if o["kind"] in DETECT_KINDS)
