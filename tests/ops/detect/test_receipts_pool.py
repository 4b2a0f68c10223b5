"""``slotrunner ops verify --receipts`` checks I2 across slots (ops/detect/receipts_pool.py):
a key applied again, or bound to another job, in a later slot is found with both
records; a replay elsewhere is not; each violation is counted once; the pool's
database lives in a temporary directory and goes; memory is one slot's keys."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import msgspec
import pytest

from ops.detect.receipts_audit import DUPLICATE_APPLIED, TWO_JOBS, ReceiptViolation, audit
from ops.detect.receipts_pool import FOLD_STATEMENTS, PoolKeys
from tests.ops.detect.receipts_home import applied, began, make_home, plant, run, summary
from tools.receipts.archive import Archive
from tools.receipts.format import Receipt, encode_line
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore, Status

KEY = "job-1:a1:s0:write_file"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path, ("S0", "S1", "S2"))


def first_slot(home: Path, archived: bool, job_id: str = "job-1") -> Path:
    """S0 applies KEY for ``job_id`` (its records rotated into a segment, or hot); the
    file that holds them."""
    slot = home / "slots" / "S0"
    store = ReceiptStore(slot)
    applied(store, KEY, job_id, 1)
    if archived:
        assert store.rotate() == 1
    store.close()
    return Archive(slot).segments()[0] if archived else slot / RECEIPTS_FILE


def applied_in_s1(home: Path, job_id: str) -> Path:
    """S1's own store applies KEY for ``job_id`` (it knows nothing of S0's); its file."""
    store = ReceiptStore(home / "slots" / "S1")
    applied(store, KEY, job_id, 2)
    store.close()
    return home / "slots" / "S1" / RECEIPTS_FILE


def items(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines()][:-1]


def in_s1(kind: str, job_id: str, bound_to: str, where: str, first: str) -> dict[str, object]:
    """The JSON item of a violation S1's record of KEY makes."""
    fields = {"job_id": job_id, "bound_to": bound_to, "where": where, "first": first}
    return {"kind": kind, "slot_id": "S1", "key": KEY, **fields}


@pytest.mark.parametrize("archived", [True, False], ids=["first-in-a-segment", "first-hot"])
def test_a_key_applied_again_in_another_slot_is_found_with_both_records(
    home: Path, archived: bool
) -> None:
    """A retry that lands on S1 (its store knows nothing of S0's) applies the key again."""
    first = first_slot(home, archived)
    again = applied_in_s1(home, "job-1")
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 1, result.output
    assert items(result.stdout) == [
        in_s1(DUPLICATE_APPLIED, "job-1", "job-1", f"{again}:2", f"{first}:2")
    ]
    got = summary(result)
    assert got["holds"] is False
    assert got["violations"][DUPLICATE_APPLIED] == 1  # type: ignore[index]
    assert got["violations"][TWO_JOBS] == 0  # type: ignore[index]
    assert got["receipts"] == {
        "slots": 2,
        "records": 4,
        "archived": 2 if archived else 0,
        "applied": 2,
        "keys": 2,
        "pool_keys": 1,
    }
    human = run(home, "--receipts")
    assert human.exit_code == 1 and "receipt violations" in human.stdout
    assert "VIOLATED" in human.stdout and "receipt pool_keys" in human.stdout


def test_a_key_bound_to_another_job_in_another_slot_is_found(home: Path) -> None:
    """job-A's key in S0 (rotated), job-B's in S1: one violation, not also a duplicate."""
    first = first_slot(home, archived=True, job_id="job-A")
    other = applied_in_s1(home, "job-B")
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 1, result.output
    assert items(result.stdout) == [in_s1(TWO_JOBS, "job-B", "job-A", f"{other}:1", f"{first}:1")]
    violations = summary(result)["violations"]
    assert isinstance(violations, dict)
    assert (violations[DUPLICATE_APPLIED], violations[TWO_JOBS]) == (0, 1)


def test_a_key_replayed_in_other_slots_holds(home: Path) -> None:
    """S1 begins the key again and fails it, S2 leaves an open intent: no second apply."""
    first_slot(home, archived=True)
    s1 = ReceiptStore(home / "slots" / "S1")
    s1.finish(began(s1, KEY, "job-1", 2), Status.FAILED, detail="replayed")
    s1.close()
    s2 = ReceiptStore(home / "slots" / "S2")
    began(s2, KEY, "job-1", 3)
    s2.close()
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 0, result.output
    got = summary(result)
    assert got["holds"] is True and items(result.stdout) == []
    assert got["receipts"] == {
        "slots": 3,
        "records": 5,
        "archived": 2,
        "applied": 1,
        "keys": 3,
        "pool_keys": 1,
    }


def _write(home: Path, slot_id: str, jobs: str) -> None:
    """KEY's records in one slot: the first through the store, then the planted ones.
    ``jobs`` spells them: ``A`` an applied record of job-A, ``a`` job-A's intent only."""
    slot = home / "slots" / slot_id
    store = ReceiptStore(slot)
    job = f"job-{jobs[0].upper()}"
    first = applied(store, KEY, job, 1) if jobs[0].isupper() else began(store, KEY, job, 1)
    store.close()
    for spelled in jobs[1:]:
        status = Status.APPLIED if spelled.isupper() else Status.INTENT
        plant(slot, msgspec.structs.replace(first, job_id=f"job-{spelled.upper()}", status=status))


@pytest.mark.parametrize(
    ("slots", "duplicates", "two_jobs"),
    [
        ({"S0": "A", "S1": "AA"}, 2, 0),  # one within S1, one S1 against S0
        ({"S0": "a", "S1": "A", "S2": "A"}, 1, 0),  # S0 never applied it: S2 against S1
        ({"S0": "A", "S1": "BC"}, 0, 2),  # C within S1, B against S0
        ({"S0": "A", "S1": "BA"}, 0, 1),  # A within S1 names the pair already
        ({"S0": "A", "S1": "B", "S2": "B"}, 0, 1),  # job-B counted once for the key
        ({"S0": "A", "S1": "B", "S2": "A"}, 1, 1),  # S2 is job-A's again, and applies it again
    ],
    ids=["AA-within-and-across", "first-apply-in-S1", "BC", "BA", "B-twice", "B-then-A-again"],
)
def test_each_violation_is_counted_once_wherever_its_records_sit(
    home: Path, slots: dict[str, str], duplicates: int, two_jobs: int
) -> None:
    """A key counts an applied record of its job beyond the first, and a job beyond the
    first, once each: within a slot or across slots, never both."""
    for slot_id, jobs in slots.items():
        _write(home, slot_id, jobs)
    found: list[ReceiptViolation] = []
    result = audit(home / "slots", found.append)
    assert result.violations == {DUPLICATE_APPLIED: duplicates, TWO_JOBS: two_jobs}
    assert len(found) == duplicates + two_jobs and result.pool_keys == 1
    for v in found:  # a violation's two records name the slots they sit in
        assert f"/{v.slot_id}/" in v.where and v.key == KEY


def test_the_pools_database_is_temporary_and_outside_the_slots(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _write(home, "S0", "A")
    _write(home, "S1", "A")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    during: list[list[Path]] = []
    result = audit(home / "slots", lambda _: during.append(list(scratch.rglob("*.sqlite"))))
    assert result.violations[DUPLICATE_APPLIED] == 1
    assert len(during) == 1 and [p.name for p in during[0]] == ["pool.sqlite"]
    assert list(scratch.iterdir()) == []  # removed at the end
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


def test_no_place_for_the_pools_database_is_unusable_input(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots are still checked one by one; the check across them is missing."""
    not_a_dir = tmp_path / "not-a-dir"
    not_a_dir.write_bytes(b"")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_dir))
    _write(home, "S0", "A")
    _write(home, "S1", "AA")
    result = run(home, "--receipts", "--json")
    assert result.exit_code == 2, result.output
    got = summary(result)
    assert list(got["unusable"]) == [str(not_a_dir)]  # type: ignore[call-overload]
    assert "no check across slots (NotADirectoryError" in got["unusable"][str(not_a_dir)]  # type: ignore[index]
    assert got["violations"][DUPLICATE_APPLIED] == 1  # type: ignore[index]  # S1's own
    human = run(home, "--receipts")
    assert human.exit_code == 2 and f"error: {not_a_dir}: no check across slots" in human.stderr
    assert "Traceback" not in human.output


def test_a_fold_reads_the_pool_by_key_never_whole() -> None:
    """Each statement a slot's fold runs scans only that slot's stage: its cost is the
    slot's keys, not the pool's (SQLite's own plans, on the pool's own schema)."""
    with PoolKeys() as pool:
        assert pool._db is not None
        for statement in FOLD_STATEMENTS:
            plan = [row[3] for row in pool._db.execute(f"EXPLAIN QUERY PLAN {statement}")]
            scans = {d.split()[1] for d in plan if d.startswith("SCAN ")}
            assert scans and scans <= {"s", "m", "stage"}, (statement, plan)


def _fill(slot: Path, keys: int) -> None:
    """``keys`` applied keys of the slot's own job, written as the store writes them."""
    job = f"{slot.name}-job"
    base = Receipt(
        key="-",
        job_id=job,
        attempt=1,
        slot_id=slot.name,
        generation=1,
        tool="write_file",
        status=Status.APPLIED,
        ts="2025-01-01T00:00:00.000000Z",
    )
    slot.mkdir(parents=True, exist_ok=True)
    with open(slot / RECEIPTS_FILE, "wb") as f:
        for n in range(keys):
            f.write(encode_line(msgspec.structs.replace(base, key=f"{job}:a1:s{n}:write_file")))


def _peak(slots_dir: Path) -> int:
    tracemalloc.start()
    try:
        result = audit(slots_dir)
        assert not any(result.violations.values())
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_one_slots_keys_not_the_pools(tmp_path: Path) -> None:
    """Eight slots of 3000 keys peak about as high as one: the pool's keys are on disk."""
    one, eight = tmp_path / "one", tmp_path / "eight"
    _fill(one / "S0", 3000)
    for n in range(8):
        _fill(eight / f"S{n}", 3000)
    assert _peak(eight) < 1.5 * _peak(one)
