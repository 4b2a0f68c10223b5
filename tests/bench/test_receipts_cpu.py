"""The receipts benchmark's CPU accounting: what each writer thread spent, per record."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bench.receipts import CpuUse, _cpu_note, _lean_writer, _raw_writer, _threads
from tools.receipts.format import Status, encode_line, parse_line


def _slots(root: Path, count: int) -> list[tuple[Path, str]]:
    jobs = []
    for index in range(count):
        slot_dir = root / f"slot-{index}"
        slot_dir.mkdir()
        jobs.append((slot_dir, f"w{index}"))
    return jobs


@pytest.mark.timeout(60)
def test_every_writer_thread_reports_its_cpu_time_for_its_own_records(tmp_path: Path) -> None:
    """Two store writers of 10 begin+finish pairs: one CpuUse each, for 20 records,
    whose user and system parts add up to the thread's CPU time."""
    cpu: list[CpuUse] = []
    run = _threads(_slots(tmp_path, 2), 20, None, cpu=cpu)
    assert run.ops == 40
    assert [use.records for use in cpu] == [20, 20]
    for use in cpu:
        assert use.total_s > 0 and 0.0 <= use.user_share <= 1.0
        per_record_us = use.total_s / use.records * 1e6
        assert use.user_us + use.system_us == pytest.approx(per_record_us)


@pytest.mark.timeout(60)
def test_a_paused_writer_still_writes_every_record(tmp_path: Path) -> None:
    """The idle arm's sleep comes before each record; it drops none of them."""
    cpu: list[CpuUse] = []
    ((slot_dir, tag),) = _slots(tmp_path, 1)
    run = _threads([(slot_dir, tag)], 10, None, cpu=cpu, pause=0.001)
    assert run.ops == 10 and cpu[0].records == 10
    assert (slot_dir / "receipts.jsonl").read_bytes().count(b"\n") == 10


def _uses(user_us: float, system_us: float) -> list[CpuUse]:
    total = (user_us + system_us) * 100 / 1e6
    return [CpuUse(total, user_us / (user_us + system_us), 100)]


def _note(idle: list[CpuUse]) -> str:
    """The note for a store at 4,000 records/s (250 us a record) on 2 CPUs."""
    cpu = {
        "store1": _uses(60, 90),
        "dsync1": _uses(5, 70),
        "raw1": _uses(5, 70),
        "memory1": _uses(20, 5),
        "idle1": idle,
    }
    return _cpu_note(cpu, raw="dsync1", store_rate=4000.0, measured=(2.0, 2.4, 3.3), cores=2)


def test_the_note_bounds_eight_slots_by_the_cpu_a_record_costs() -> None:
    """150 us of CPU per record (60 user) at 250 us a record on 2 CPUs: every CPU busy
    allows 2 * 250 / 150 = 3.33x; the user time serialised allows 250 / 60 = 4.17x."""
    note = _note(idle=_uses(70, 15))
    assert "the store 60 us user + 90 us system of 250 us per record" in note
    assert "raw RWF_DSYNC writes 5 + 70 us" in note
    assert "here the store's user time is 3.0x that" in note
    assert "on a CPU that went idle meanwhile" in note
    assert "at most 3.33x one writer" in note and "at most about 4.17x" in note
    assert "Measured: 2.00x as threads, 2.40x as processes" in note


def test_the_note_does_not_blame_idling_when_idling_costs_nothing() -> None:
    note = _note(idle=_uses(21, 6))
    assert "so idling alone does not explain it" in note
    assert "went idle meanwhile" not in note and "Not the device's doing" not in note


@pytest.mark.timeout(60)
def test_the_lean_writer_writes_records_the_store_would_read(tmp_path: Path) -> None:
    """The lean arm is a fair floor only if it writes the same records: every line it
    appends parses as a receipt of the store's format, intent then outcome per key."""
    durations = _lean_writer(tmp_path, 5, "lean")
    assert len(durations) == 10
    lines = (tmp_path / "lean.jsonl").read_bytes().splitlines(keepends=True)
    receipts = [parse_line(line) for line in lines]
    assert all(r is not None for r in receipts), lines
    assert [(r.key, r.status) for r in receipts if r is not None] == [
        (f"lean:k{i}", status) for i in range(5) for status in (Status.INTENT, Status.APPLIED)
    ]


@pytest.mark.timeout(60)
def test_the_model_writer_writes_the_lean_records_through_the_store_s_model(
    tmp_path: Path,
) -> None:
    """The model arm differs from the lean one only in who makes the line: the same
    records, field for field (all but the clock's stamp), made by Receipt + record_of."""
    lean_dir, model_dir = tmp_path / "lean", tmp_path / "model"
    lean_dir.mkdir()
    model_dir.mkdir()
    _lean_writer(lean_dir, 3, "t")
    assert len(_lean_writer(model_dir, 3, "t", model=True)) == 6

    def records(directory: Path) -> list[dict[str, object]]:
        lines = (directory / "lean.jsonl").read_bytes().splitlines(keepends=True)
        parsed = [parse_line(line) for line in lines]
        assert all(r is not None for r in parsed), lines
        return [
            {**msgspec.structs.asdict(r), "ts": None, "slot_id": None}
            for r in parsed
            if r is not None
        ]

    assert records(model_dir) == records(lean_dir)
    first = (model_dir / "lean.jsonl").read_bytes().splitlines(keepends=True)[0]
    record = parse_line(first)
    assert record is not None and encode_line(record) == first


def test_the_protocol_writer_writes_every_line_inside_its_lock(tmp_path: Path) -> None:
    """The design floor's writer appends each of its records whole (with the lock file
    it takes beside them), as many as it was asked for."""
    lines = [b'{"a":1}\n', b'{"bb":22}\n']
    durations = _raw_writer(tmp_path, lines, 5, dsync=True, protocol=True)
    assert len(durations) == 5 and all(d > 0 for d in durations)
    assert (tmp_path / "raw.jsonl").read_bytes() == b"".join([*lines, *lines, lines[0]])
    assert (tmp_path / "raw.lock").exists()
