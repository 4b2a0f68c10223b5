"""``slotrunner ops verify --receipts``: I2 over every slot's receipts, rotated and hot
(ops/detect/receipts_audit.py): the counts it read, the records that break a rule
wherever they sit, and an unreadable archive as unusable input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from ops.detect.receipts_audit import DUPLICATE_APPLIED, TWO_JOBS, audit
from tests.ops.detect.receipts_home import applied, make_home, plant, run, summary
from tests.support.receipts import slot_receipts
from tools.receipts.archive import ARCHIVE_DIR, INDEX_FILE, Archive
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore, Status


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path)


def generations(slot: Path, count: int, rotate: bool = True) -> ReceiptStore:
    """``count`` generations of two applied keys each, all but the last rotated away;
    the jobs are the slot's own (``S0-job-1``): no other slot applies their keys."""
    store = ReceiptStore(slot)
    for generation in range(1, count + 1):
        job = f"{slot.name}-job-{generation}"
        for step in range(2):
            applied(store, f"{job}:a1:s{step}:write_file", job, generation)
        if rotate and generation < count:
            assert store.rotate() == 2
    return store


def test_rotated_slots_hold_and_the_counts_are_what_was_read(home: Path) -> None:
    """Three generations in S0 (two rotated), one in S1: every record read once."""
    generations(home / "slots" / "S0", 3).close()
    generations(home / "slots" / "S1", 1).close()
    assert len(Archive(home / "slots" / "S0").segments()) == 2
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 0, result.output
    got = summary(result)
    assert got["holds"] is True and got["unusable"] == {}
    assert got["receipts"] == {
        "slots": 2,
        "records": 16,
        "archived": 8,
        "applied": 8,
        "keys": 8,
        "pool_keys": 8,
    }
    records = len(slot_receipts(home / "slots" / "S0")) + len(slot_receipts(home / "slots" / "S1"))
    assert records == 16
    violations = got["violations"]
    assert isinstance(violations, dict)
    assert violations[DUPLICATE_APPLIED] == 0 and violations[TWO_JOBS] == 0
    human = run(home, "--receipts")
    assert human.exit_code == 0 and "I1 and I2 hold" in human.stdout
    assert "16 receipts (8 archived) of 2 slots" in human.stdout


def test_without_the_flag_no_receipt_is_read(home: Path) -> None:
    generations(home / "slots" / "S0", 2).close()
    result = run(home, "--json")
    assert result.exit_code == 0
    got = summary(result)
    assert "receipts" not in got
    assert isinstance(got["violations"], dict) and DUPLICATE_APPLIED not in got["violations"]


@pytest.mark.parametrize("archived", [True, False], ids=["in-a-segment", "in-the-hot-file"])
def test_a_second_applied_record_of_a_key_is_found_where_it_sits(
    home: Path, archived: bool
) -> None:
    slot = home / "slots" / "S0"
    store = ReceiptStore(slot)
    first = applied(store, "job-1:a1:s0:write_file", "job-1", 1)
    applied(store, "job-1:a1:s1:write_file", "job-1", 1)
    plant(slot, msgspec.structs.replace(first, ts="2999-01-01T00:00:00.000000Z"))
    if archived:
        assert store.rotate() == 2  # the planted line goes into the segment, verbatim
        applied(store, "job-2:a1:s0:write_file", "job-2", 2)
        file = Archive(slot).segments()[0]
    else:
        file = slot / RECEIPTS_FILE
    store.close()
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 1, result.output
    *items, got = [json.loads(line) for line in result.stdout.splitlines()]
    assert items == [
        {
            "kind": DUPLICATE_APPLIED,
            "slot_id": "S0",
            "key": "job-1:a1:s0:write_file",
            "job_id": "job-1",
            "bound_to": "job-1",
            "where": f"{file}:5",  # the planted line
            "first": f"{file}:2",  # the store's own applied record
        }
    ]
    assert got["holds"] is False and got["violations"][DUPLICATE_APPLIED] == 1
    human = run(home, "--receipts")
    assert human.exit_code == 1 and "receipt violations" in human.stdout
    assert "VIOLATED" in human.stdout


def test_a_key_that_names_two_jobs_is_found(home: Path) -> None:
    """Another job's records of a key already bound (archived): one violation a job."""
    slot = home / "slots" / "S0"
    store = ReceiptStore(slot)
    first = applied(store, "shared-key", "job-1", 1)
    assert store.rotate() == 1
    foreign = msgspec.structs.replace(first, job_id="job-2", generation=2)
    plant(slot, msgspec.structs.replace(foreign, status=Status.INTENT))
    plant(slot, foreign)
    store.close()
    found = audit(home / "slots")
    assert found.violations == {DUPLICATE_APPLIED: 0, TWO_JOBS: 1}
    assert (found.records, found.archived, found.applied) == (4, 2, 1)
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 1
    (item,) = [json.loads(line) for line in result.stdout.splitlines()][:-1]
    assert (item["kind"], item["job_id"], item["bound_to"]) == (TWO_JOBS, "job-2", "job-1")
    assert item["first"].startswith(str(slot / ARCHIVE_DIR))
    assert item["where"] == f"{slot / RECEIPTS_FILE}:1"


def test_a_rotation_crashed_before_its_rename_is_read_once(home: Path) -> None:
    """The hot file stays and its bytes are in a segment too: no phantom duplicate."""
    slot = home / "slots" / "S0"
    store = generations(slot, 1)
    segment = slot / ARCHIVE_DIR / "00000001.jsonl.gz"

    def crash_before_the_rename(fd: int, directory: str) -> None:
        if directory == str(slot) and segment.exists():  # the fresh hot file's fsync
            raise OSError(5, "injected EIO")

    store._archive.fsync = crash_before_the_rename  # the seam the archive's writes go through
    with pytest.raises(OSError, match="injected EIO"):
        store.rotate()
    applied(store, "S0-job-1:a1:s2:write_file", "S0-job-1", 1)
    store.close()
    assert segment.exists() and len(slot_receipts(slot)) == 10  # the store reads both
    found = audit(home / "slots")
    assert found.violations == {DUPLICATE_APPLIED: 0, TWO_JOBS: 0}
    assert (found.records, found.archived, found.applied) == (6, 0, 3)


def _not_gzip(segment: Path) -> None:
    segment.write_bytes(b"this is no gzip stream\n")


def _cut(segment: Path) -> None:
    segment.write_bytes(segment.read_bytes()[:-12])


def _garbled_index(slot: Path) -> Path:
    index = slot / ARCHIVE_DIR / INDEX_FILE
    index.write_bytes(b"\0garbage" * 512)
    return index


@pytest.mark.parametrize("damage", ["not-gzip", "cut", "index"])
def test_an_unreadable_archive_is_unusable_input_named_by_file(home: Path, damage: str) -> None:
    slot = home / "slots" / "S0"
    generations(slot, 2).close()
    segment = Archive(slot).segments()[0]
    if damage == "index":
        named = _garbled_index(slot)
    else:
        (_not_gzip if damage == "not-gzip" else _cut)(segment)
        named = segment
    result = run(home, "--receipts")
    assert result.exit_code == 2, result.output
    assert f"error: {named}: unreadable receipts" in result.stderr
    assert "Traceback" not in result.output and "INCOMPLETE" in result.stdout
    as_json = run(home, "--receipts", "--json")
    assert as_json.exit_code == 2 and str(named) in summary(as_json)["unusable"]  # type: ignore[operator]


def test_no_slots_directory_is_unusable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "slotrunner.jsonl").write_bytes(b"")
    result = run(home, "--receipts")
    assert result.exit_code == 2
    assert f"error: {home / 'slots'}: no slots to read" in result.stderr
