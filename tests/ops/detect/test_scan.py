"""ops.detect.scan: chunked reading gives exactly what the line-by-line reference gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.detect.records import AppliedLine, Apply, Malformed, Record
from ops.detect.scan import Tally, read_chunks, records_of, scan, scan_chunk
from ops.testing.synthlog import synth_log
from runner.core import events
from tests.support.detectlog import lease_line, log_line, result_line


def _fields(rec: Record) -> tuple[object, ...]:
    """What a record says, whichever spelling it has (decoded struct or plain tuple)."""
    if isinstance(rec, Malformed):
        return ("malformed", rec.path, rec.line)
    where = (rec.path, rec.line, rec.host, rec.slot_id, rec.generation, rec.job_id, rec.attempt)
    if isinstance(rec, AppliedLine | Apply):
        return ("apply", *where, rec.tool, rec.key, rec.receipt_job, rec.ts)
    return ("lease", *where, rec.released, rec.ts)


def _chunked(path: Path, **sizes: int) -> tuple[list[tuple[object, ...]], Tally]:
    tally = Tally(str(path))
    found = [
        _fields(rec)
        for chunk in read_chunks(tally, **sizes)
        for rec in records_of(scan_chunk(chunk, tally))
    ]
    return found, tally


def _reference(path: Path) -> tuple[list[tuple[object, ...]], Tally]:
    tally = Tally(str(path))
    data = path.read_bytes()
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return [_fields(rec) for rec in scan(lines, tally)], tally


def _counts(tally: Tally) -> tuple[int, int, int, str | None]:
    return (tally.lines, tally.blank, tally.malformed, tally.error)


ODD_LINES = [
    log_line(events.JOB_FINISHED, note="applied"),  # a candidate of another event
    result_line("A", 1, "k", tool="read_file").replace(b'"k"', b"null"),  # null key, applied
    result_line("A", 1, ""),  # an apply with an empty key
    result_line("A", 1, "k2").replace(b'"slot_generation": 1', b'"slot_generation": true'),
    lease_line("A", 1).replace(b'"attempt": 1', b'"attempt": "1"'),
    result_line("A", 1, "k3").replace(b'"service_ms": 1.0, ', b""),
    result_line("A", 1, "k4", outcome=events.OUTCOME_REPLAYED),
    json.dumps({"event": "x", "applied": "applied", "host": "h", "ts": "t"}).encode(),
    b'{"event": "tool_result", "outcome": "applied", broken}',
    b'{"no_event_here": 1}',
    lease_line("A", 1) + b", " + lease_line("A", 2),  # two objects: one element each in an array
]


@pytest.mark.parametrize("chunk_bytes", [64, 4096, 1 << 20])
def test_chunks_agree_with_the_line_by_line_reference(tmp_path: Path, chunk_bytes: int) -> None:
    """Any chunk size: the same records, malformed lines and counts as one line at a time."""
    path = tmp_path / "log.jsonl"
    synth_log(path, 4_000, seed=3)
    with open(path, "ab") as fh:
        for i, odd in enumerate(ODD_LINES):
            fh.write(odd + b"\n" + lease_line(f"J{i}", i + 2) + b"\n")
        fh.write(b"\n  \n" + lease_line("Z", 99) + b"\r\n" + result_line("Z", 99, "z"))
    found, tally = _chunked(path, chunk_bytes=chunk_bytes)
    want, ref = _reference(path)
    assert found == want
    assert _counts(tally) == _counts(ref)
    assert ref.malformed > len(ODD_LINES) // 2 and ref.blank == 2


def test_odd_candidates_alone_take_the_slow_road_and_clean_chunks_stay_fast(
    tmp_path: Path,
) -> None:
    """A clean chunk is decoded in one call; an odd candidate falls back without loss."""
    clean = b"".join(
        lease_line("A", 1) + b"\n" + result_line("A", 1, f"k{i}") + b"\n" for i in range(50)
    )
    batch = scan_chunk(clean, Tally("x"))
    assert batch.lines and not batch.records
    odd = clean + ODD_LINES[0] + b"\n" + ODD_LINES[2] + b"\n"
    tally = Tally("x")
    batch = scan_chunk(odd, tally)
    assert batch.records and not batch.lines
    assert [type(r).__name__ for r in batch.records][-1] == "Malformed"
    assert tally.malformed == 1 and tally.lines == 102


def test_overlong_line_is_one_malformed_line_never_held_whole(tmp_path: Path) -> None:
    """A line past the limit is skipped as it streams by, counted once; numbering goes on."""
    path = tmp_path / "log.jsonl"
    big = b'{"event": "x", "pad": "' + b"y" * 50_000 + b'"}'
    path.write_bytes(lease_line("A", 1) + b"\n" + big + b"\n" + lease_line("A", 2) + b"\n" + big)
    found, tally = _chunked(path, chunk_bytes=4096, max_line_bytes=10_000)
    assert [f[:3] for f in found] == [
        ("lease", str(path), 1),
        ("malformed", str(path), 2),
        ("lease", str(path), 3),
        ("malformed", str(path), 4),
    ]
    assert _counts(tally) == (4, 0, 2, None)


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    """A whole last line without its newline is a record; a torn one is malformed."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(lease_line("A", 1) + b"\n" + result_line("A", 1, "k"))
    found, tally = _chunked(path)
    assert [f[:3] for f in found] == [("lease", str(path), 1), ("apply", str(path), 2)]
    path.write_bytes(lease_line("A", 1) + b"\n" + result_line("A", 1, "k")[:-9])
    found, tally = _chunked(path)
    assert [f[:3] for f in found] == [("lease", str(path), 1), ("malformed", str(path), 2)]
    assert tally.malformed == 1
