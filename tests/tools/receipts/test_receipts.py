"""The per-slot receipt store: intent before effect, one outcome, replay, torn lines, EIO."""

from __future__ import annotations

import json
import multiprocessing
import os
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.disk import Disk
from tools.reasons import Reason
from tools.receipts.store import (
    RECEIPTS_FILE,
    Begin,
    KeyBoundToOtherJob,
    Receipt,
    ReceiptDurabilityError,
    ReceiptStore,
    Status,
    utc_stamp,
)

# A bounded wait for anything another process must do; never a sleep.
_PROC_DEADLINE_S = 60.0
_RACE_KEYS = 50


def _begin(store: ReceiptStore, key: str, job_id: str = "job-a", **extra: Any) -> Begin:
    fields: dict[str, Any] = {
        "attempt": 1,
        "slot_id": "s1",
        "generation": 7,
        "tool": "write_file",
        "relpath": "src/a.py",
    }
    fields.update(extra)
    return store.begin(key=key, job_id=job_id, **fields)


def _lines(slot: Path) -> list[bytes]:
    return (slot / RECEIPTS_FILE).read_bytes().splitlines(keepends=True)


# -- spawned-process helpers (module level so `spawn` can import them) ----------------


def _race_begins(slot: str, job_id: str, barrier: Barrier, out: Any) -> None:
    store = ReceiptStore(Path(slot))
    seen = []
    for i in range(_RACE_KEYS):
        barrier.wait(timeout=_PROC_DEADLINE_S)
        began = _begin(store, f"k{i}", job_id=job_id)
        seen.append((f"k{i}", began.fresh, began.receipt.to_wire()))
    out.put(seen)


def _read_in_fresh_process(slot: str, key: str, out: Any) -> None:
    found = ReceiptStore(Path(slot)).lookup(key)
    out.put(None if found is None else found.to_wire())


def _run_spawned(target: Any, *args: Any, count: int = 1) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for _ in range(count)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=_PROC_DEADLINE_S) for _ in procs]
    for proc in procs:
        proc.join(timeout=_PROC_DEADLINE_S)
        assert proc.exitcode == 0
    return results


# -- intent, outcome, replay ----------------------------------------------------------


def test_intent_then_outcome_are_written_in_order(slot: Path) -> None:
    """begin writes an intent line, finish an outcome line after it, same key and job."""
    store = ReceiptStore(slot)
    began = _begin(store, "k1", digest="d-pre")
    assert began.fresh and began.receipt.status is Status.INTENT
    assert [json.loads(x)["status"] for x in _lines(slot)] == ["intent"]
    done = store.finish(began.receipt, Status.APPLIED, digest="d-post", result={"bytes": 3})
    rows = [json.loads(x) for x in _lines(slot)]
    assert [r["status"] for r in rows] == ["intent", "applied"]
    assert rows[1] == done.to_wire()
    assert rows[1]["key"] == "k1" and rows[1]["job_id"] == "job-a"
    assert rows[1]["digest"] == "d-post" and rows[1]["result"] == {"bytes": 3}
    assert rows[1]["relpath"] == "src/a.py" and rows[1]["generation"] == 7


def test_replay_returns_original_receipt_and_writes_nothing(slot: Path) -> None:
    """A second begin on an applied key returns the original outcome; the file is unchanged."""
    store = ReceiptStore(slot)
    done = store.finish(_begin(store, "k1").receipt, Status.APPLIED, digest="d1")
    before = (slot / RECEIPTS_FILE).read_bytes()
    again = _begin(store, "k1", attempt=2, generation=7)
    assert again == Begin(receipt=done, fresh=False)
    assert ReceiptStore(slot).lookup("k1") == done
    assert (slot / RECEIPTS_FILE).read_bytes() == before


def test_failed_outcome_is_also_replayed(slot: Path) -> None:
    """A key whose outcome is failed is not applied again: begin returns the failure."""
    store = ReceiptStore(slot)
    failed = store.finish(_begin(store, "k1").receipt, Status.FAILED, detail="patch did not apply")
    assert _begin(store, "k1") == Begin(receipt=failed, fresh=False)


def test_open_intent_is_returned_not_rewritten(slot: Path) -> None:
    """begin on a key with an intent and no outcome returns that intent; no second intent."""
    intent = _begin(ReceiptStore(slot), "k1").receipt
    before = (slot / RECEIPTS_FILE).read_bytes()
    again = _begin(ReceiptStore(slot), "k1", attempt=2)
    assert again == Begin(receipt=intent, fresh=False)
    assert (slot / RECEIPTS_FILE).read_bytes() == before


def test_finish_twice_keeps_the_first_outcome(slot: Path) -> None:
    """A second finish of one intent returns the first outcome and writes no line."""
    store = ReceiptStore(slot)
    intent = _begin(store, "k1").receipt
    first = store.finish(intent, Status.APPLIED)
    assert ReceiptStore(slot).finish(intent, Status.FAILED) == first
    assert len(_lines(slot)) == 2


@pytest.mark.parametrize("outcome", [None, Status.APPLIED])
def test_key_bound_to_other_job_is_refused(slot: Path, outcome: Status | None) -> None:
    """A key whose records name another job is refused, even when only an intent exists."""
    store = ReceiptStore(slot)
    intent = _begin(store, "k1", job_id="job-a").receipt
    if outcome is not None:
        store.finish(intent, outcome)
    before = (slot / RECEIPTS_FILE).read_bytes()
    with pytest.raises(KeyBoundToOtherJob) as info:
        _begin(ReceiptStore(slot), "k1", job_id="job-b")
    assert info.value.reason is Reason.KEY_BOUND_TO_OTHER_JOB
    assert "job-a" in info.value.message
    assert (slot / RECEIPTS_FILE).read_bytes() == before


def test_restart_sees_open_intents(slot: Path) -> None:
    """A new store instance (a restart) lists intents without outcomes, in file order."""
    store = ReceiptStore(slot)
    open_1 = _begin(store, "k1").receipt
    store.finish(_begin(store, "k2").receipt, Status.APPLIED)
    open_3 = _begin(store, "k3").receipt
    assert ReceiptStore(slot).open_intents() == [open_1, open_3]


def test_index_follows_appends_from_another_instance(slot: Path) -> None:
    """A store sees records another instance appended after its own last read."""
    reader, writer = ReceiptStore(slot), ReceiptStore(slot)
    assert reader.lookup("k1") is None
    done = writer.finish(_begin(writer, "k1").receipt, Status.APPLIED)
    assert reader.lookup("k1") == done
    assert reader.open_intents() == []


def test_records_yields_valid_records_in_order(slot: Path) -> None:
    """records() yields every valid record in file order and skips garbage."""
    store = ReceiptStore(slot)
    a = _begin(store, "k1").receipt
    with open(slot / RECEIPTS_FILE, "ab") as f:
        f.write(b"not json\n")
    b = store.finish(a, Status.APPLIED)
    assert list(ReceiptStore(slot).records()) == [a, b]


def test_timestamps_are_utc_iso(slot: Path) -> None:
    """ts is UTC ISO 8601 from the injected clock; a naive clock is refused."""
    fixed = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert _begin(ReceiptStore(slot, clock=lambda: fixed), "k1").receipt.ts == (
        "2024-05-01T12:00:00.000000Z"
    )
    with pytest.raises(ValueError, match="naive"):
        _begin(ReceiptStore(slot, clock=lambda: datetime(2024, 5, 1)), "k2")


def _iso(micros: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


@pytest.mark.parametrize(
    "micros",
    [0, 1, 999_999, 1_000_000, 1_764_000_000_999_999, 1_764_000_001_000_000, 4_102_444_799_123_456],
)
def test_the_default_stamp_is_the_datetime_one(micros: int) -> None:
    """The default clock's fast stamp is, to the microsecond, the ISO form of the same
    instant as a UTC datetime, including across a second boundary (its cached part)."""
    assert utc_stamp(micros * 1000 + 999) == _iso(micros)
    assert utc_stamp((micros + 1) * 1000) == _iso(micros + 1)


def test_the_default_clock_stamps_records_now(slot: Path) -> None:
    """A store with the default clock stamps each record with the moment it wrote it."""
    before = datetime.now(UTC)
    receipt = _begin(ReceiptStore(slot), "k1").receipt
    after = datetime.now(UTC)
    assert receipt.ts.endswith("Z") and len(receipt.ts) == len("2026-12-07T05:58:33.123456Z")
    assert before - timedelta(microseconds=1) <= datetime.fromisoformat(receipt.ts) <= after


def test_to_wire_omits_none_fields(slot: Path) -> None:
    """to_wire drops None fields so optional ones are absent from the line."""
    wire = _begin(ReceiptStore(slot), "k1", relpath=None).receipt.to_wire()
    assert "relpath" not in wire and "detail" not in wire and "result" not in wire


def test_missing_slot_dir_is_a_clear_error(tmp_path: Path) -> None:
    """A store over a slot directory that does not exist names the path."""
    with pytest.raises(FileNotFoundError, match="nope"):
        ReceiptStore(tmp_path / "nope")


# -- torn and garbage lines -------------------------------------------------------------


def test_torn_last_line_is_absent_and_next_record_is_its_own_line(slot: Path) -> None:
    """Half a JSON line at the end is ignored and counted; the next record parses alone."""
    half = b'{"key":"k1","job_id":"job-a","attempt":1,"slot_id":"s1","gen'
    (slot / RECEIPTS_FILE).write_bytes(half)
    store = ReceiptStore(slot)
    assert store.lookup("k1") is None
    assert store.torn_lines == 1
    began = _begin(store, "k1")
    assert began.fresh
    lines = _lines(slot)
    assert len(lines) == 2 and lines[0].startswith(half)
    assert json.loads(lines[1]) == began.receipt.to_wire()
    fresh = ReceiptStore(slot)
    assert fresh.lookup("k1") == began.receipt
    assert fresh.torn_lines == 1 and store.torn_lines == 1


def test_torn_complete_record_without_newline_never_becomes_a_phantom(slot: Path) -> None:
    """A whole JSON record that lost its newline stays absent even after later appends."""
    store = ReceiptStore(slot)
    ghost = _begin(store, "ghost").receipt.to_wire() | {"key": "k-ghost"}
    with open(slot / RECEIPTS_FILE, "ab") as f:
        f.write(json.dumps(ghost).encode())  # no trailing newline: its fsync never returned
    assert store.lookup("k-ghost") is None
    _begin(store, "k2")
    for reader in (store, ReceiptStore(slot)):
        assert reader.lookup("k-ghost") is None
        assert reader.torn_lines == 1
        assert [r.key for r in reader.records()] == ["ghost", "k2"]


def test_garbage_and_binary_lines_are_counted_and_ignored(slot: Path) -> None:
    """Garbage, binary, non-object and invalid-record lines are counted, never records."""
    store = ReceiptStore(slot)
    _begin(store, "k1")
    with open(slot / RECEIPTS_FILE, "ab") as f:
        f.write(b"garbage\n\xff\xfe\x00\x81binary\n[1, 2]\n")
        f.write(b'{"key":"k9","status":"applied"}\n')  # missing required fields
    _begin(store, "k2")
    fresh = ReceiptStore(slot)
    assert fresh.torn_lines == 4 and store.torn_lines == 4
    assert fresh.lookup("k9") is None
    assert [r.key for r in fresh.records()] == ["k1", "k2"]


# -- durability -----------------------------------------------------------------------


def test_failed_fsync_raises_outcome_unknown(slot: Path) -> None:
    """On a disk whose fsync fails, begin raises ReceiptDurabilityError (outcome_unknown)."""
    with pytest.raises(ReceiptDurabilityError) as info:
        _begin(ReceiptStore(slot, fsync=Disk(failing=True).fsync), "k1")
    assert info.value.reason is Reason.OUTCOME_UNKNOWN
    assert "k1" in info.value.message


def test_fsync_eio_is_never_retried(slot: Path) -> None:
    """After one fsync EIO the store raises and never calls fsync again, for any write."""
    disk = Disk()
    store = ReceiptStore(slot, fsync=disk.fsync)
    intent = _begin(store, "k0").receipt  # before the fault: the file already exists
    disk.failing, disk.calls = True, []
    with pytest.raises(ReceiptDurabilityError) as info:
        _begin(store, "k1")
    assert info.value.reason is Reason.OUTCOME_UNKNOWN
    assert disk.calls == [str(slot)]
    never_again = "is not written after an earlier failure"
    with pytest.raises(ReceiptDurabilityError, match=never_again):
        store.finish(intent, Status.APPLIED)
    with pytest.raises(ReceiptDurabilityError, match=never_again):
        _begin(store, "k2")
    assert disk.calls == [str(slot)]


def test_outcome_is_fsynced_and_visible_to_another_process(
    slot: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When finish returns, a sync already covered its line (the append's own RWF_DSYNC
    write, or an fsync after it) and a fresh process reads it."""
    path = slot / RECEIPTS_FILE
    store = ReceiptStore(slot)
    intent = _begin(store, "k1").receipt
    real_fsync, real_pwritev = os.fsync, os.pwritev
    synced: list[bytes] = []

    def spying_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(path.read_bytes())

    def spying_pwritev(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        written = real_pwritev(fd, buffers, offset, flags)
        if flags & os.RWF_DSYNC:
            synced.append(path.read_bytes())
        return written

    monkeypatch.setattr(os, "fsync", spying_fsync)
    monkeypatch.setattr(os, "pwritev", spying_pwritev)
    done = store.finish(intent, Status.APPLIED, digest="d1")
    monkeypatch.undo()
    line = json.dumps(done.to_wire(), separators=(",", ":")).encode() + b"\n"
    assert synced and synced[-1].endswith(line)
    assert path.read_bytes().endswith(line)
    assert _run_spawned(_read_in_fresh_process, str(slot), "k1") == [done.to_wire()]


# -- cross-process ----------------------------------------------------------------------


def test_two_processes_racing_begin_get_one_fresh_intent_per_key(slot: Path) -> None:
    """Two processes racing begin on the same 50 keys: exactly one fresh intent per key."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    runs = _run_spawned(_race_begins, str(slot), "job-a", barrier, count=2)
    by_key: dict[str, list[tuple[bool, dict[str, Any]]]] = {}
    for run in runs:
        for key, fresh, wire in run:
            by_key.setdefault(key, []).append((fresh, wire))
    assert len(by_key) == _RACE_KEYS
    for key, seen in by_key.items():
        assert sorted(fresh for fresh, _ in seen) == [False, True], key
        assert seen[0][1] == seen[1][1], key  # both callers hold the same intent
    rows = [json.loads(x) for x in _lines(slot)]
    assert len(rows) == _RACE_KEYS
    assert {r["key"] for r in rows} == set(by_key)
    assert all(msgspec.convert(r, Receipt).status is Status.INTENT for r in rows)


# -- kept-open descriptors --------------------------------------------------------------


def _child_begins_after_fork(store: ReceiptStore) -> int:
    """In a forked child: the inherited descriptors are dropped, then a record is written."""
    try:
        if store._handles.lock_fd is not None or store._handles.append_fd is not None:
            return 3
        _begin(store, "k-child", job_id="job-child")
        return 0
    except BaseException:
        return 4


def test_a_moved_aside_receipts_file_is_refused_not_appended_to(slot: Path) -> None:
    """Receipts moved aside under a live store: the next write fails closed, nothing lands."""
    store = ReceiptStore(slot)
    _begin(store, "k1")
    moved = slot / "receipts.old"
    (slot / RECEIPTS_FILE).rename(moved)
    before = moved.read_bytes()
    with pytest.raises(ReceiptDurabilityError, match="vanished"):
        _begin(store, "k2")
    (slot / RECEIPTS_FILE).write_bytes(before)  # a copy put back: another file now
    with pytest.raises(ReceiptDurabilityError, match="replaced"):
        _begin(store, "k2")
    assert moved.read_bytes() == before


def test_finish_keeps_its_own_copy_of_the_result(slot: Path) -> None:
    """Changing the caller's result dict after finish changes neither the index nor replays."""
    store = ReceiptStore(slot)
    result: dict[str, Any] = {"bytes": 3, "paths": ["a"]}
    done = store.finish(_begin(store, "k1").receipt, Status.APPLIED, result=result)
    result["bytes"] = 99
    assert store.lookup("k1") == done
    assert done.result == {"bytes": 3, "paths": ["a"]}
    assert ReceiptStore(slot).lookup("k1") == done


def test_own_records_and_foreign_records_interleave_in_the_index(slot: Path) -> None:
    """Records this store wrote itself and records another store wrote are all in its index."""
    a, b = ReceiptStore(slot), ReceiptStore(slot)
    ka = _begin(a, "ka").receipt
    kb = _begin(b, "kb").receipt
    done_a = a.finish(ka, Status.APPLIED)
    done_b = b.finish(kb, Status.FAILED, detail="x")
    for store in (a, b, ReceiptStore(slot)):
        assert store.lookup("ka") == done_a and store.lookup("kb") == done_b
        assert store.open_intents() == [] and store.torn_lines == 0
    assert [r.key for r in ReceiptStore(slot).records()] == ["ka", "kb", "ka", "kb"]


@pytest.mark.parametrize("relpath", ["src/caf\u00e9_\u2215.py", "src/bad\udc80name.py"])
def test_non_ascii_fields_are_written_as_ascii_escapes(slot: Path, relpath: str) -> None:
    """Non-ASCII text, even a lone surrogate, is stored escaped on one line and reads back."""
    store = ReceiptStore(slot)
    began = _begin(store, "k1", relpath=relpath)
    raw = (slot / RECEIPTS_FILE).read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1 and b"\\u" in raw
    assert ReceiptStore(slot).lookup("k1") == began.receipt
    assert store.torn_lines == 0


def test_a_forked_child_opens_its_own_descriptors(slot: Path) -> None:
    """A store used across fork: the child drops what it inherited and its record lands."""
    store = ReceiptStore(slot)
    _begin(store, "k-parent")  # the parent's descriptors are open now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's result is its exit status
        os._exit(_child_begins_after_fork(store))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.lookup("k-child") is not None
    assert [r.key for r in store.records()] == ["k-parent", "k-child"]
