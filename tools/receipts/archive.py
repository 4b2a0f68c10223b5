"""Receipts of finished generations, out of the hot file: kept for audit and for the
key rules, read by no hot path (docs/architecture.md §Receipts, #17).

A slot that has served ten thousand jobs holds about a million records. Kept in
``receipts.jsonl``, every process that opens the store would read them all and hold
every key in memory. So when a slot is leased again (``runner.slots.pool``), the
records of the generations before, all settled, are *rotated* out of the hot file
into the slot's archive::

    receipts.archive/keys.sqlite        key -> (job, the key's last record): the key
                                        rules' memory, one B-tree lookup a key
    receipts.archive/<seq>.jsonl.gz     the rotated hot file's bytes, verbatim: audit
    receipts.archive/rotated.json       {"dev", "ino"} of the hot file the last
                                        rotation put in place

A key stays bound to its first job, and applied at most once, ever (I2): the store
asks :meth:`Archive.get` for every key its hot index does not hold, so a key of a
rotated generation still answers its receipt (a replay) or ``key_bound_to_other_job``.
The store's start-up reads only the hot file, and its memory holds only the hot keys.

Rotation is crash-safe in its order: the keys are committed to the index first
(durable: ``synchronous=FULL``), then the segment is written durably, then the
marker names the new empty hot file, which replaces the old one by ``rename``. A
crash before the rename leaves the hot file whole and its keys in both places (the
hot index answers first, and the same file maps to the same segment number, so the
next rotation rewrites that segment instead of adding a copy). Only the current hot
file keeps its mapping: each rotation retires the others' first, since the inode of
a file a finished rotation removed can come back as a later hot file's. Another process's
store that finds the hot file replaced reads the marker: the file it names is a
rotation's (read from the start; the rotated keys are in the index), any other
replacement is the loss it always was (``ReceiptDurabilityError``).
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from runner.core.durable import Fsync, ensure_dir, fsync_dir, os_fsync, replace_file
from tools.receipts.format import Receipt, encode_line, parse_line

ARCHIVE_DIR = "receipts.archive"
INDEX_FILE = "keys.sqlite"
MARKER_FILE = "rotated.json"
SEGMENT_SUFFIX = ".jsonl.gz"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys(
    key TEXT PRIMARY KEY, job_id TEXT NOT NULL, line BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rotations(
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, seq INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (dev, ino)
);
"""


class Archive:
    """One slot's archive. Opened lazily; a forked child opens its own connection."""

    def __init__(self, slot_dir: Path, *, fsync: Fsync = os_fsync) -> None:
        self.dir = slot_dir / ARCHIVE_DIR
        self.index_path = self.dir / INDEX_FILE
        self.fsync = fsync
        self._db: sqlite3.Connection | None = None
        self._pid = 0
        self._absent = False  # seen absent: a rotation (a new hot file) must come first

    def recheck(self) -> None:
        """The hot file was replaced: a rotation may have made the archive since."""
        self._absent = False

    def _connect(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():
            ensure_dir(self.dir, fsync=self.fsync)
            db = sqlite3.connect(self.index_path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA cache_size=-512")  # KiB: memory stays flat however large
            db.executescript(_SCHEMA)
            self._db, self._pid = db, os.getpid()
        return self._db

    def close(self) -> None:
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
        self._db = None

    def get(self, key: str) -> Receipt | None:
        """The last record of a rotated ``key``, or None (never rotated, or no archive).

        An archive seen absent is not looked for again until :meth:`recheck`: every
        rotation makes the index before it replaces the hot file, and the store that
        follows the replacement rechecks, so a fresh key costs no ``stat``.
        """
        if self._db is None and (self._absent or not self.index_path.exists()):
            self._absent = True
            return None
        row = self._connect().execute("SELECT line FROM keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else parse_line(bytes(row[0]))

    def marker(self) -> tuple[int, int] | None:
        """(dev, ino) of the hot file the last rotation put in place, if any."""
        try:
            record = json.loads((self.dir / MARKER_FILE).read_bytes())
            return int(record["dev"]), int(record["ino"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def segment(self, seq: int) -> Path:
        """The segment file of rotation ``seq``."""
        return self.dir / f"{int(seq):08d}{SEGMENT_SUFFIX}"

    def segments(self) -> list[Path]:
        """The rotated segments, oldest first."""
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))

    def records(self, segments: list[Path] | None = None) -> Iterator[Receipt]:
        """Every valid record of ``segments`` (default: all), in the order written."""
        for segment in self.segments() if segments is None else segments:
            with gzip.open(segment, "rb") as f:
                for raw in f:
                    receipt = parse_line(raw)
                    if receipt is not None:
                        yield receipt

    def rotate(
        self, hot: Path, identity: tuple[int, int], raw: bytes, last: dict[str, Receipt]
    ) -> tuple[int, int]:
        """Archive the hot file (its identity, bytes and each key's last record) and put
        an empty hot file in its place; the caller holds the receipts lock and has
        checked that no intent is open. Returns the new hot file's identity.

        Raises ``OSError`` (``DurabilityError`` for a failed fsync): then the hot file is
        still the old one, or the new one with the old one's keys already archived.
        """
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT OR IGNORE INTO keys(key, job_id, line) VALUES (?, ?, ?)",
                [(key, r.job_id, encode_line(r)) for key, r in last.items()],
            )
            # Only the current hot file may find its own row (a rotation of it that
            # crashed before its rename). Every other row names a file a finished
            # rotation unlinked, whose inode number the filesystem may give to a later
            # hot file: retire those (one unique impossible identity each) before that
            # file could map onto an older generation's segment and overwrite it.
            db.execute(
                "UPDATE rotations SET dev = -1, ino = -seq "
                "WHERE dev != -1 AND NOT (dev = ? AND ino = ?)",
                identity,
            )
            db.execute(
                "INSERT OR IGNORE INTO rotations(dev, ino, seq) VALUES "
                "(?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM rotations))",
                identity,
            )
            (seq,) = db.execute(
                "SELECT seq FROM rotations WHERE dev = ? AND ino = ?", identity
            ).fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        replace_file(
            self.segment(seq),
            gzip.compress(raw, compresslevel=6, mtime=0),
            fsync=self.fsync,
        )
        return self._fresh_hot(hot)

    def _fresh_hot(self, hot: Path) -> tuple[int, int]:
        tmp = hot.with_name(f".{hot.name}.rotating.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            self.fsync(fd, str(hot.parent))
            st = os.fstat(fd)
        finally:
            os.close(fd)
        identity = (st.st_dev, st.st_ino)
        marker = json.dumps({"dev": identity[0], "ino": identity[1]}).encode() + b"\n"
        try:
            replace_file(self.dir / MARKER_FILE, marker, fsync=self.fsync)
            os.replace(tmp, hot)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(hot.parent, fsync=self.fsync)
        return identity
