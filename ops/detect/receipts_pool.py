"""I2 across slots: each slot's keys folded, one slot at a time, into one SQLite database.

:mod:`ops.detect.receipts_audit` reads a slot with a dict of that slot's keys. A key is
bound to one job and applied at most once in the whole pool, though, not only in its
slot (a retry that lands on another slot must not apply it again), and a dict of every
slot's keys would grow with the pool (some 10^7 keys after months). Here they live in a
database in a temporary directory instead (``tempfile``, so ``$TMPDIR``; removed by
:meth:`PoolKeys.close`, nothing is written under the slots dir), behind a page cache of
fixed size: memory is one slot's dict, whatever the pool holds; disk about 80 bytes a
key (a key is kept as its 16-byte blake2b :func:`fingerprint`, a file as a number).
Once a slot's own pass is done, its keys are folded in, slots in name order, with
set-based queries that read the pool by key, never whole (:data:`FOLD_STATEMENTS`):

1. :meth:`PoolKeys.stage` copies the slot's keys into ``stage`` (the key, the job of its
   first record in the slot, that record, the first ``applied`` record of that job or
   NULL) and ``stage_others`` (the key's other jobs in the slot);
2. :meth:`PoolKeys.bound_elsewhere`: a key an earlier slot holds, none of whose jobs in
   this slot the pool has seen for it, is ``key_bound_to_two_jobs``: this slot's first
   record against the pool's first. A slot naming one of the key's known jobs adds
   nothing: its other jobs were reported within the slot. A key is reported once a job
   it names beyond the first, wherever its records sit;
3. :meth:`PoolKeys.applied_elsewhere`: a key bound to the same job here and in the
   pool, applied here and in an earlier slot, is ``duplicate_applied_receipt``: this
   slot's first ``applied`` record against the earlier slot's (its later ones were
   reported within the slot). Records of another job than the key's in their slot are
   judged only as ``key_bound_to_two_jobs``, as within a slot (so job-A's ``applied``
   record in a slot whose first record of the key is job-B's is not also a duplicate of
   job-A's in an earlier slot);
4. :meth:`PoolKeys.merge`: a new key joins ``pool`` with its first binding, a key's job
   applied for the first time keeps that record, and a key's other jobs join
   ``pool_jobs``.

A location is ``<file>:<line>``; each file is stored once, in ``files``. A database that
cannot be kept (no place, or no room, in the temporary directory) stops the check
across slots and sets :attr:`PoolKeys.problem`, which the audit reports as unusable
input; the slots' own checks go on.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

POOL_FILE = "pool.sqlite"
CACHE_KIB = 8192  # SQLite's page cache: the database's whole memory, whatever its size
FAILED = (OSError, sqlite3.Error)

_RECORDS = """job_id TEXT NOT NULL, first_file INTEGER NOT NULL, first_line INTEGER NOT NULL,
    applied_file INTEGER, applied_line INTEGER"""
_SCHEMA = f"""
CREATE TABLE files(id INTEGER PRIMARY KEY, path TEXT NOT NULL);
CREATE TABLE pool(fp BLOB PRIMARY KEY, {_RECORDS}) WITHOUT ROWID;
CREATE TABLE stage(fp BLOB PRIMARY KEY, key TEXT NOT NULL, {_RECORDS}) WITHOUT ROWID;
CREATE TABLE pool_jobs(fp BLOB, job_id TEXT, PRIMARY KEY (fp, job_id)) WITHOUT ROWID;
CREATE TABLE stage_others(fp BLOB, job_id TEXT, PRIMARY KEY (fp, job_id)) WITHOUT ROWID;
"""

# The slot's record and the pool's, each as <file>:<line>.
_LOCATIONS = """
SELECT s.key, s.job_id, p.job_id, sf.path || ':' || s.{0}_line, pf.path || ':' || p.{0}_line
FROM stage s JOIN pool p ON p.fp = s.fp
JOIN files sf ON sf.id = s.{0}_file JOIN files pf ON pf.id = p.{0}_file
"""
_BOUND_ELSEWHERE = (
    _LOCATIONS.format("first")
    + """WHERE s.job_id != p.job_id
AND NOT EXISTS (SELECT 1 FROM pool_jobs o WHERE o.fp = s.fp AND o.job_id = s.job_id)
AND NOT EXISTS (
    SELECT 1 FROM stage_others m WHERE m.fp = s.fp AND (m.job_id = p.job_id
    OR EXISTS (SELECT 1 FROM pool_jobs o WHERE o.fp = m.fp AND o.job_id = m.job_id)))
ORDER BY s.key"""
)
_APPLIED_ELSEWHERE = _LOCATIONS.format("applied") + "WHERE s.job_id = p.job_id ORDER BY s.key"
_MERGE = (
    # Driven by the stage (one slot's keys), never a scan of the pool.
    """UPDATE pool SET (applied_file, applied_line) = (
        SELECT s.applied_file, s.applied_line FROM stage s WHERE s.fp = pool.fp)
    WHERE fp IN (SELECT s.fp FROM stage s JOIN pool p ON p.fp = s.fp
        WHERE s.job_id = p.job_id AND p.applied_file IS NULL AND s.applied_file IS NOT NULL)""",
    """INSERT OR IGNORE INTO pool_jobs SELECT s.fp, s.job_id FROM stage s
    JOIN pool p ON p.fp = s.fp WHERE s.job_id != p.job_id""",
    """INSERT OR IGNORE INTO pool_jobs SELECT m.fp, m.job_id FROM stage_others m
    LEFT JOIN pool p ON p.fp = m.fp WHERE p.job_id IS NOT m.job_id""",
)
_INSERT = """INSERT OR IGNORE INTO pool
SELECT fp, job_id, first_file, first_line, applied_file, applied_line FROM stage ORDER BY fp"""
# What a fold runs over the pool: each statement reads it by key, never scans it, so a
# slot costs its own keys' lookups however large the pool (the test reads their plans).
FOLD_STATEMENTS = (_BOUND_ELSEWHERE, _APPLIED_ELSEWHERE, *_MERGE, _INSERT)


def fingerprint(key: str) -> bytes:
    """What the pool keeps of a key: 16 bytes of blake2b (any str, lone surrogates too)."""
    return blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass
class SlotKey:
    """A key as one slot's records have it."""

    job_id: str  # the job of its first record in the slot
    first: str  # <file>:<line> of that record
    applied: str | None = None  # <file>:<line> of that job's first applied record
    others: set[str] = field(default_factory=set)  # the other jobs it names in the slot


class Crossing(NamedTuple):
    """A key's record in this slot against an earlier slot's."""

    key: str
    job_id: str  # the job of this slot's record
    bound_to: str  # the job of the pool's first record of the key
    where: str  # <file>:<line> of this slot's record
    first: str  # <file>:<line> of the earlier slot's record it contradicts


class PoolKeys:
    """The keys of every slot folded so far; see the module docstring for the order."""

    def __init__(self) -> None:
        self.keys = 0  # distinct keys across the slots folded
        self.problem: tuple[str, str] | None = None  # (path, why) once the database failed
        self._files = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._path = "TMPDIR"  # what a failure names: the database, once it has a place
        self._db: sqlite3.Connection | None = None
        try:
            self._path = tempfile.gettempdir()
            self._dir = tempfile.TemporaryDirectory(prefix="slotrunner-receipts-")
            self._path = str(Path(self._dir.name) / POOL_FILE)
            self._db = sqlite3.connect(self._path)
            for pragma in ("journal_mode = OFF", "synchronous = OFF", "temp_store = FILE"):
                self._db.execute(f"PRAGMA {pragma}")
            self._db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            self._db.executescript(_SCHEMA)
        except FAILED as exc:
            self._fail(exc)

    def stage(self, keys: Mapping[str, SlotKey]) -> None:
        """Copy one slot's keys in; then ask, and :meth:`merge`, before the next."""
        if self._db is None:
            return
        files: dict[str, int] = {}

        def at(where: str) -> tuple[int, int]:
            path, _, line = where.rpartition(":")
            if path not in files:
                files[path] = self._files + len(files) + 1
            return files[path], int(line)

        def rows() -> Iterator[tuple[object, ...]]:
            for key, k in keys.items():
                applied = at(k.applied) if k.applied else (None, None)
                yield fingerprint(key), key, k.job_id, *at(k.first), *applied

        try:
            self._db.executemany("INSERT INTO stage VALUES (?, ?, ?, ?, ?, ?, ?)", rows())
            self._db.executemany(
                "INSERT INTO stage_others VALUES (?, ?)",
                ((fingerprint(key), job) for key, k in keys.items() for job in k.others),
            )
            self._db.executemany(
                "INSERT INTO files VALUES (?, ?)", ((i, path) for path, i in files.items())
            )
            self._files += len(files)
        except FAILED as exc:
            self._fail(exc)

    def bound_elsewhere(self) -> Iterator[Crossing]:
        """The staged keys an earlier slot binds to another job (``first``: its record)."""
        return self._crossings(_BOUND_ELSEWHERE)

    def applied_elsewhere(self) -> Iterator[Crossing]:
        """The staged keys applied here and in an earlier slot, by the same job."""
        return self._crossings(_APPLIED_ELSEWHERE)

    def merge(self) -> None:
        """Fold the staged keys into the pool and empty the stage."""
        if self._db is None:
            return
        try:
            for statement in _MERGE:
                self._db.execute(statement)
            self.keys += self._db.execute(_INSERT).rowcount
            self._db.execute("DELETE FROM stage")
            self._db.execute("DELETE FROM stage_others")
            self._db.commit()
        except FAILED as exc:
            self._fail(exc)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> PoolKeys:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _crossings(self, query: str) -> Iterator[Crossing]:
        if self._db is None:
            return
        try:
            for row in self._db.execute(query):
                yield Crossing(*row)
        except FAILED as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.problem = (self._path, f"no check across slots ({type(exc).__name__}: {exc})")
        if self._db is not None:
            self._db.close()
            self._db = None
