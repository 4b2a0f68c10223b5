"""The applied keys of ``ops detect --follow``, on disk: memory flat however long it runs.

A one-shot ``ops detect`` holds its keys in memory (:class:`ops.detect.keys.KeySet`,
about 20 bytes a key): it ends. A follower does not, and "applied at most once, ever"
forgets nothing, so in memory its key set would grow with the log for as long as the
pool runs (11 million keys, about 220 MB, after a 10 GB log). Here the keys live in a
SQLite table in the state dir instead, behind a page cache of fixed size
(docs/architecture.md §Detector state): the follower's memory is the same after ten
gigabytes of log as after ten megabytes, and a key costs one indexed insert.

``keys.sqlite`` holds one row per key, ``(seq, fp)``: ``fp`` is the key's 8-byte
fingerprint (the first 8 bytes of its 16-byte blake2b digest, as before), ``seq`` the
order it was first applied in. Keys added by a poll stay in the open transaction
until :meth:`KeyStore.commit`, which the follower calls right before it replaces its
checkpoint; the checkpoint names the count it matches. A crash between the commit and
the checkpoint leaves rows of lines that will be read again: :meth:`KeyStore.open` cuts
the table back to the checkpoint's count (``seq`` above it), as the old ``keys.hex``
journal was cut back to its length, so a re-read line is never its own duplicate.

A ``keys.hex`` journal from before (one hex digest per line) is imported once, in
chunks, when no ``keys.sqlite`` exists yet.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from hashlib import blake2b
from pathlib import Path

from ops.errors import OpsError

KEYS_FILE = "keys.sqlite"
LEGACY_FILE = "keys.hex"
CACHE_KIB = 4096  # SQLite's page cache: the store's whole memory, whatever its size
_IMPORT_CHUNK = 1 << 20


class KeyStoreError(OpsError):
    """The key table is damaged or does not match the checkpoint."""


class KeyStore:
    """Applied-key fingerprints in SQLite; :meth:`add` says whether a key was seen."""

    def __init__(self, db: sqlite3.Connection, count: int) -> None:
        self._db, self._n = db, count
        self._insert = "INSERT OR IGNORE INTO keys (seq, fp) VALUES (?, ?)"
        db.execute("BEGIN")

    @classmethod
    def open(cls, state_dir: Path, count: int, *, legacy_bytes: int | None = None) -> KeyStore:
        """The store of ``state_dir`` cut back to ``count`` keys (the checkpoint's).

        ``legacy_bytes``: a version-1 checkpoint's length of ``keys.hex``, imported on
        the first open; ``count`` is then the number imported (kept in ``meta``), since
        the version-1 checkpoint knows bytes, not keys.
        """
        path = state_dir / KEYS_FILE
        fresh = not path.exists()
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise KeyStoreError(f"{path}: {exc}") from exc
        try:
            return cls(db, _prepare(db, path, state_dir, count, fresh, legacy_bytes))
        except BaseException:
            db.close()
            raise

    def __len__(self) -> int:
        return self._n

    def add(self, key: str) -> bool:
        """Record ``key``; True when it had been applied before."""
        fp = _fingerprint(blake2b(key.encode(), digest_size=16).digest())
        if self._db.execute(self._insert, (self._n + 1, fp)).rowcount == 0:
            return True
        self._n += 1
        return False

    def commit(self) -> int:
        """Make the keys added so far durable; the count the checkpoint must name."""
        self._db.execute("COMMIT")
        self._db.execute("BEGIN")
        return self._n

    def close(self) -> None:
        """Drop what was added since the last commit (a crash does the same)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        self._db.close()


def _prepare(
    db: sqlite3.Connection,
    path: Path,
    state_dir: Path,
    count: int,
    fresh: bool,
    legacy_bytes: int | None,
) -> int:
    """Make the tables, import a version-1 journal, cut back to the checkpoint; the count."""
    try:
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")  # a commit is durable before the checkpoint
        db.execute("CREATE TABLE IF NOT EXISTS keys (seq INTEGER PRIMARY KEY, fp INTEGER NOT NULL)")
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS keys_fp ON keys (fp)")
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER)")
        if legacy_bytes is not None:
            if fresh:
                _import_or_remove(db, path, state_dir / LEGACY_FILE, legacy_bytes)
            row = db.execute("SELECT value FROM meta WHERE name = 'imported'").fetchone()
            if row is None:
                raise KeyStoreError(f"{path} exists beside a version-1 checkpoint")
            count = row[0]
        (held,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM keys").fetchone()
        if held < count:
            raise KeyStoreError(f"{path} holds {held} keys, the checkpoint says {count}")
        if held > count:
            db.execute("DELETE FROM keys WHERE seq > ?", (count,))  # lines to be re-read
    except sqlite3.Error as exc:
        raise KeyStoreError(f"{path}: {exc}") from exc
    return count


def _fingerprint(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little", signed=True) or 1


def _import_or_remove(db: sqlite3.Connection, path: Path, journal: Path, length: int) -> None:
    """Import ``journal`` into a new table, or leave no table behind (the next start retries)."""
    try:
        _import_legacy(db, journal, length)
    except KeyStoreError:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            path.with_name(KEYS_FILE + suffix).unlink(missing_ok=True)
        raise


def _import_legacy(db: sqlite3.Connection, journal: Path, length: int) -> None:
    """Rows for the first ``length`` bytes of a ``keys.hex`` journal, in its order, and
    their count in ``meta``, in one transaction."""
    if length and (not journal.exists() or os.path.getsize(journal) < length):
        raise KeyStoreError(f"{journal} is shorter than the checkpoint says")
    n = 0
    db.execute("BEGIN")
    for digests in _journal_chunks(journal, length):
        try:
            rows = [
                (n + i, _fingerprint(bytes.fromhex(d.decode()))) for i, d in enumerate(digests, 1)
            ]
        except ValueError as exc:
            raise KeyStoreError(f"{journal} is damaged ({exc})") from exc
        db.executemany("INSERT OR IGNORE INTO keys (seq, fp) VALUES (?, ?)", rows)
        n += len(rows)
    db.execute("INSERT INTO meta VALUES ('imported', ?)", (n,))
    db.execute("COMMIT")


def _journal_chunks(journal: Path, length: int) -> Iterator[list[bytes]]:
    """The journal's first ``length`` bytes as lists of hex digests, a chunk at a time."""
    if not length:
        return
    rest, left = b"", length
    with open(journal, "rb") as fh:
        while left:
            chunk = fh.read(min(_IMPORT_CHUNK, left))
            if not chunk:
                raise KeyStoreError(f"{journal} is shorter than the checkpoint says")
            left -= len(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            yield lines
    if rest:
        raise KeyStoreError(f"{journal} is damaged (a digest without its newline)")
