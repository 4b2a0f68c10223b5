"""I2 over the receipts themselves: every slot's records, rotated and hot, read back.

The event log proves I1 and I2 for the applies it names (:mod:`ops.detect.verify`); a
log rotated away names none of a finished generation's. The receipts stay: a lease
moves a slot's settled records into ``receipts.archive/`` (``tools/receipts/archive.py``,
docs/architecture.md §Receipts), and this module reads them back, segments first, then
the hot file, each line where it is (``<file>:<line>``), and checks:

- ``duplicate_applied_receipt`` (I2): a key has one ``applied`` record at most (the
  ``status`` field of :class:`tools.receipts.format.Receipt`);
- ``key_bound_to_two_jobs`` (I2, I1): a key's records all name the job of its first
  record (the store binds a key to its first job, forever).

Both hold across the pool, not only within a slot: a slot is read with a dict of its
own keys, then folded into a database of every slot's keys on disk
(:mod:`ops.detect.receipts_pool`), which finds a key applied again, or bound to
another job, in a later slot (by name); such a violation names the later slot, its
``first`` the earlier slot's record. Each is reported once, wherever the records sit:
a key counts one ``duplicate_applied_receipt`` for each ``applied`` record of its job
beyond the first, and one ``key_bound_to_two_jobs`` for each job beyond the first (a
record of another job than the key's in its slot is only that).

It only reads: no lock is taken and nothing is created in a slot (the index is opened
read-only; the pool's database is in a temporary directory, removed at the end, and a
database that cannot be kept there is unusable input, the slots still checked one by
one). A rotation that crashed before its ``rename`` leaves the hot file in place
*and* its bytes in a segment; that segment (its number is the hot file's in the index's
``rotations`` table, and its bytes begin the hot file) is read once, as the hot file.

:func:`last_slot_of` serves ``ops restore`` when the event log no longer names a job's
slot: the slot whose receipts name the job last.
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.detect.receipts_pool import PoolKeys, SlotKey
from tools.receipts.archive import ARCHIVE_DIR, INDEX_FILE, SEGMENT_SUFFIX, Archive
from tools.receipts.format import Receipt, Status, parse_line
from tools.receipts.store import RECEIPTS_FILE

DUPLICATE_APPLIED = "duplicate_applied_receipt"
TWO_JOBS = "key_bound_to_two_jobs"
RECEIPT_KINDS = (DUPLICATE_APPLIED, TWO_JOBS)

# What a damaged file raises: a bad gzip header (BadGzipFile is an OSError), a cut
# segment (EOFError), a damaged deflate stream (zlib.error), an index that is not a
# database or lacks its tables (sqlite3.DatabaseError).
UNREADABLE = (OSError, EOFError, zlib.error, sqlite3.DatabaseError)


class _Unreadable(Exception):
    """A receipts file of a slot cannot be read; ``path`` names it. Private: caught in
    this module and turned into unusable input (or a slot skipped)."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        super().__init__(f"unreadable receipts ({type(exc).__name__}: {exc})")
        self.path = path


@dataclass(frozen=True)
class ReceiptViolation:
    kind: str
    slot_id: str
    key: str
    job_id: str  # the job of the record that breaks the rule
    bound_to: str  # the job of the key's first record (in the pool)
    where: str  # <file>:<line> of that record
    first: str  # <file>:<line> of the record it contradicts

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **{k: v for k, v in self.__dict__.items() if k != "kind"}}


@dataclass
class ReceiptAudit:
    """What was read, and what broke the rules."""

    slots: int = 0
    records: int = 0
    archived: int = 0  # of ``records``, read from rotated segments
    applied: int = 0
    keys: int = 0  # each slot's distinct keys, summed: a key in two slots counts twice
    pool_keys: int = 0  # distinct keys across the pool
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RECEIPT_KINDS, 0))
    unusable: dict[str, str] = field(default_factory=dict)  # path -> why

    def to_json(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "records": self.records,
            "archived": self.archived,
            "applied": self.applied,
            "keys": self.keys,
            "pool_keys": self.pool_keys,
        }


def slot_dirs(slots_dir: Path) -> list[Path]:
    """The slot directories under ``slots_dir`` that hold receipts, by name."""
    return sorted(
        p
        for p in slots_dir.iterdir()
        if (p / RECEIPTS_FILE).is_file() or (p / ARCHIVE_DIR).is_dir()
    )


def audit(
    slots_dir: Path, on_violation: Callable[[ReceiptViolation], None] = lambda _: None
) -> ReceiptAudit:
    """Check every slot under ``slots_dir``; each violation also goes to on_violation."""
    result = ReceiptAudit()
    try:
        slots = slot_dirs(slots_dir)
    except OSError as exc:
        result.unusable[str(slots_dir)] = f"no slots to read ({exc.strerror or exc})"
        return result
    with PoolKeys() as pool:
        for slot_dir in slots:
            result.slots += 1
            keys: dict[str, SlotKey] = {}
            try:
                _audit_slot(slot_dir, keys, result, on_violation)
            except _Unreadable as exc:
                result.unusable[str(exc.path)] = str(exc)
            result.keys += len(keys)
            _fold(slot_dir.name, keys, pool, result, on_violation)
        result.pool_keys = pool.keys
        if pool.problem is not None:
            result.unusable[pool.problem[0]] = pool.problem[1]
    return result


def _audit_slot(
    slot_dir: Path,
    keys: dict[str, SlotKey],
    result: ReceiptAudit,
    on_violation: Callable[[ReceiptViolation], None],
) -> None:
    """The slot's own pass: ``keys`` fills as its records are read."""

    def violation(kind: str, r: Receipt, state: SlotKey, where: str, first: str) -> None:
        result.violations[kind] += 1
        on_violation(
            ReceiptViolation(kind, slot_dir.name, r.key, r.job_id, state.job_id, where, first)
        )

    for path, archived in _files(slot_dir):
        for where, r in _read(path):
            result.records += 1
            result.archived += archived
            state = keys.get(r.key)
            if state is None:
                state = keys[r.key] = SlotKey(r.job_id, where)
            elif r.job_id != state.job_id:
                if r.job_id not in state.others:
                    state.others.add(r.job_id)
                    violation(TWO_JOBS, r, state, where, state.first)
                continue
            if r.status is Status.APPLIED:
                result.applied += 1
                if state.applied is None:
                    state.applied = where
                else:
                    violation(DUPLICATE_APPLIED, r, state, where, state.applied)


def _fold(
    slot_id: str,
    keys: dict[str, SlotKey],
    pool: PoolKeys,
    result: ReceiptAudit,
    on_violation: Callable[[ReceiptViolation], None],
) -> None:
    """The slot's keys against every earlier slot's, then into the pool."""
    pool.stage(keys)
    for kind, found in (
        (TWO_JOBS, pool.bound_elsewhere()),
        (DUPLICATE_APPLIED, pool.applied_elsewhere()),
    ):
        for c in found:
            result.violations[kind] += 1
            on_violation(ReceiptViolation(kind, slot_id, *c))
    pool.merge()


def _files(slot_dir: Path) -> list[tuple[Path, bool]]:
    """The slot's receipt files in written order, each with whether it is a segment."""
    archive, hot = Archive(slot_dir), slot_dir / RECEIPTS_FILE
    try:
        listed = archive.segments()
    except OSError as exc:
        raise _Unreadable(archive.dir, exc) from exc
    copy = _crashed_copy(slot_dir)
    files = [(p, True) for p in listed if p != copy]
    if hot.exists():
        files.append((hot, False))
    return files


def _crashed_copy(slot_dir: Path) -> Path | None:
    """The segment a crashed rotation made of the hot file still in place, if any."""
    index, hot = slot_dir / ARCHIVE_DIR / INDEX_FILE, slot_dir / RECEIPTS_FILE
    if not index.exists() or not hot.exists():
        return None
    try:
        st = os.stat(hot)
        with _read_only(index) as db:
            row = db.execute(
                "SELECT seq FROM rotations WHERE dev = ? AND ino = ?", (st.st_dev, st.st_ino)
            ).fetchone()
    except UNREADABLE as exc:
        raise _Unreadable(index, exc) from exc
    if row is None:
        return None
    segment = Archive(slot_dir).segment(row[0])
    try:
        copied = gzip.decompress(segment.read_bytes())
        with open(hot, "rb") as f:
            same = f.read(len(copied)) == copied
    except FileNotFoundError:
        return None  # the crash came before the segment
    except UNREADABLE as exc:
        raise _Unreadable(segment, exc) from exc
    return segment if same else None


def _read_only(index: Path) -> closing[sqlite3.Connection]:
    """The archive's index, opened read-only (nothing is created, no schema written)."""
    return closing(sqlite3.connect(f"{index.resolve().as_uri()}?mode=ro", uri=True))


def _read(path: Path) -> Iterator[tuple[str, Receipt]]:
    """Each valid record of one file with its ``<file>:<line>``; a line that is not one
    whole record is absent, as it is to the store. Raises :class:`_Unreadable`."""
    try:
        with gzip.open(path, "rb") if path.name.endswith(SEGMENT_SUFFIX) else open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                receipt = parse_line(raw)
                if receipt is not None:
                    yield f"{path}:{n}", receipt
    except UNREADABLE as exc:
        raise _Unreadable(path, exc) from exc


def last_slot_of(slots_dir: Path, job_id: str) -> tuple[str | None, list[str]]:
    """The slot whose receipts name ``job_id`` latest (by record ``ts``), and the
    receipt files that could not be read on the way. The archive's index is asked
    first (each rotated key's last record, with its job); the segments are read only
    when the slot has no index."""
    best: tuple[str, str] | None = None
    skipped: list[str] = []
    try:
        slots = slot_dirs(slots_dir)
    except OSError:
        return None, skipped
    for slot_dir in slots:
        try:
            ts = _last_ts(slot_dir, job_id)
        except _Unreadable as exc:
            skipped.append(str(exc.path))
            continue
        if ts is not None and (best is None or ts >= best[0]):
            best = (ts, slot_dir.name)
    return (best[1] if best else None), skipped


def _last_ts(slot_dir: Path, job_id: str) -> str | None:
    index = slot_dir / ARCHIVE_DIR / INDEX_FILE
    stamps: list[str] = []
    if index.exists():
        try:
            with _read_only(index) as db:
                rows = db.execute("SELECT line FROM keys WHERE job_id = ?", (job_id,)).fetchall()
        except UNREADABLE as exc:
            raise _Unreadable(index, exc) from exc
        stamps += [r.ts for (line,) in rows if (r := parse_line(bytes(line))) is not None]
        files = [slot_dir / RECEIPTS_FILE]
    else:
        files = [path for path, _ in _files(slot_dir)]
    for path in files:
        if path.exists():
            stamps += [r.ts for _, r in _read(path) if r.job_id == job_id]
    return max(stamps, default=None)
