"""Follow live logs: tail them, survive rotation and truncation, resume where it stopped.

State in the state dir (``$SLOTRUNNER_HOME/detector/`` unless told otherwise):

``checkpoint.json``  per path the cursors ``(dev, inode, offset, line)``, the ownership
                     timelines, the counters and the number of applied keys it matches
``keys.sqlite``      the applied idempotency keys, on disk (:mod:`ops.detect.keystore`):
                     the follower's memory stays flat however long the log grows

Each poll reads the new *complete* lines of every file, judges them, hands incidents
and malformed lines to the sink (which pages; its own outbox is durable), commits the
new keys (fsynced), then replaces the checkpoint. A crash anywhere in between
resumes from the last checkpoint with the state of that checkpoint (the key table is
cut back to the count it names), so no line is skipped and none is judged against
a state that had already seen it; the sink's dedup keys absorb the incidents that
are found again. A version-1 state dir (keys in ``keys.hex``) is imported once.

Rotation (the path names a new inode): the old file, still open, is read for
``rotate_grace_s`` more, because writers holding its descriptor may still append,
then read to its very end (a last line without a newline counts) and closed; the new
file is read from offset 0. If the follower was down during a rotation, the old
inode is looked for beside the path (``slotrunner.jsonl.1``) and finished first.
Truncation (offset beyond the size, as ``copytruncate`` does): read from 0 again (a
file truncated and refilled past the old offset between two polls looks like growth).
Files named on the command line only; ``.gz`` files are history, not followed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ops.detect.detector import (
    GZIP_MAGIC,
    Incident,
    Malformed,
    Record,
    Replay,
    Tally,
    judge_records,
    merge_by_ts,
    scan,
)
from ops.detect.keystore import KeyStore, KeyStoreError
from ops.errors import OpsError
from runner.core.durable import replace_file

READ_BUDGET = 16 * 1024 * 1024  # bytes per file per poll: bounds memory on a huge backlog
Sink = Callable[[list[Incident | Malformed]], None]


class FollowError(OpsError):
    """A path cannot be followed, or the state dir is damaged."""


@dataclass
class Cursor:
    dev: int
    ino: int
    offset: int = 0
    line: int = 0
    drain_until: float | None = None  # set once rotated away: read until then, then finish
    fh: BinaryIO | None = field(default=None, repr=False)

    @property
    def identity(self) -> tuple[int, int]:
        return (self.dev, self.ino)

    def to_json(self) -> dict[str, object]:
        return {
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "line": self.line,
            "draining": self.drain_until is not None,
        }


class Follower:
    """Tails ``paths``; every poll judges what was appended since the last one."""

    def __init__(
        self,
        paths: Sequence[str],
        state_dir: Path,
        sink: Sink,
        *,
        rotate_grace_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        warn: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.labels = {os.path.abspath(p): p for p in paths}
        self.state_dir = state_dir
        self._sink, self._grace_s, self._clock, self._warn = sink, rotate_grace_s, clock, warn
        for path in self.labels:
            if not os.path.exists(path) and not os.path.isdir(os.path.dirname(path)):
                raise FollowError(f"{self.labels[path]}: no such file or directory")
        state_dir.mkdir(parents=True, exist_ok=True)
        self._ckpt = state_dir / "checkpoint.json"
        self.lines = self.malformed = 0
        self._dirty = False
        self._cursors: dict[str, list[Cursor]] = {}
        self._load()

    # -- state ---------------------------------------------------------------------

    def _load(self) -> None:
        try:
            ckpt = json.loads(self._ckpt.read_bytes())
        except FileNotFoundError:
            ckpt = None
        except ValueError as exc:
            raise FollowError(f"{self._ckpt} is damaged ({exc}); move the state dir away") from exc
        try:
            if ckpt is None:
                keys = KeyStore.open(self.state_dir, 0)
            elif ckpt.get("version") == 1:  # keys in keys.hex, as many bytes as it says
                keys = KeyStore.open(self.state_dir, 0, legacy_bytes=int(ckpt["keys_bytes"]))
            else:
                keys = KeyStore.open(self.state_dir, int(ckpt["keys"]))
        except KeyStoreError as exc:
            raise FollowError(f"{exc}; move the state dir away") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise FollowError(f"{self._ckpt} is damaged ({exc}); move the state dir away") from exc
        self._keys = keys
        try:
            self.replay = Replay.restore(ckpt["replay"], keys) if ckpt else Replay(keys)
            if ckpt:
                self.lines, self.malformed = int(ckpt["lines"]), int(ckpt["malformed"])
                self._reopen(ckpt["files"])
        except (KeyError, TypeError, ValueError) as exc:
            keys.close()
            raise FollowError(f"{self._ckpt} is damaged ({exc}); move the state dir away") from exc

    def _reopen(self, files: dict[str, list[dict[str, Any]]]) -> None:
        """Open every file the checkpoint was reading, wherever rotation has moved it."""
        now = self._clock()
        for path, stored in files.items():
            if path not in self.labels:
                continue
            for c in stored:
                cursor = Cursor(c["dev"], c["ino"], c["offset"], c["line"])
                cursor.fh = _open_inode(path, cursor.dev, cursor.ino)
                if cursor.fh is None:
                    self._warn(
                        f"{self.labels[path]}: the file read up to line {cursor.line} "
                        f"is gone (rotated and removed while stopped)"
                    )
                    continue
                if c["draining"] or _identity_at(path) != cursor.identity:
                    cursor.drain_until = now + self._grace_s  # rotated while we were stopped
                self._cursors.setdefault(path, []).append(cursor)

    def _checkpoint(self) -> None:
        ckpt = {
            "version": 2,
            "files": {p: [c.to_json() for c in cs] for p, cs in self._cursors.items()},
            "replay": self.replay.snapshot(),
            "keys": self._keys.commit(),
            "lines": self.lines,
            "malformed": self.malformed,
        }
        replace_file(self._ckpt, json.dumps(ckpt).encode())
        self._dirty = False

    # -- reading -------------------------------------------------------------------

    def poll(self) -> bool:
        """Read, judge, sink, checkpoint; True when a file had more than one budget waiting."""
        now = self._clock()
        streams: list[list[Record]] = []
        more = False
        for path in self.labels:
            records, hit = self._read_path(path, now)
            streams.append(records)
            more = more or hit
        items = list(judge_records(merge_by_ts(streams), self.replay))
        self._sink(items)
        if self._dirty:
            self._checkpoint()
        return more

    def run(self, stop: threading.Event, poll_s: float = 0.2) -> None:
        while not stop.is_set():
            if not self.poll():
                stop.wait(poll_s)

    def close(self) -> None:
        self._keys.close()
        for cursors in self._cursors.values():
            for cursor in cursors:
                if cursor.fh is not None:
                    cursor.fh.close()

    def _read_path(self, path: str, now: float) -> tuple[list[Record], bool]:
        cursors = self._cursors.setdefault(path, [])
        current = cursors[-1] if cursors and cursors[-1].drain_until is None else None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is None and current is not None:
            current.drain_until = now + self._grace_s  # renamed away; its successor not yet there
        elif st is not None and (current is None or (st.st_dev, st.st_ino) != current.identity):
            fh = _open_plain(path, self.labels[path])
            if fh is not None:
                if current is not None:
                    current.drain_until = now + self._grace_s
                fst = os.fstat(fh.fileno())
                cursors.append(Cursor(fst.st_dev, fst.st_ino, fh=fh))
                self._dirty = True
        elif current is not None and st is not None and st.st_size < current.offset:
            self._warn(f"{self.labels[path]}: truncated below offset {current.offset}; from 0")
            current.offset = current.line = 0
            self._dirty = True
        records: list[Record] = []
        for cursor in list(cursors):  # oldest first: a rotated file's lines precede its successor's
            final = cursor.drain_until is not None and now >= cursor.drain_until
            if self._read_cursor(self.labels[path], cursor, final, records):
                return records, True  # the rest of this file first, at the next poll
            if final:
                assert cursor.fh is not None
                cursor.fh.close()
                cursors.remove(cursor)
                self._dirty = True
        return records, False

    def _read_cursor(self, label: str, cursor: Cursor, final: bool, out: list[Record]) -> bool:
        """Append the records of the new complete lines to ``out``; True when the budget was hit."""
        assert cursor.fh is not None
        cursor.fh.seek(cursor.offset)
        data = cursor.fh.read(READ_BUDGET)
        hit = len(data) == READ_BUDGET
        if not final or hit:
            # Only whole lines: the writer's one write() per line may be half-way in.
            end = data.rfind(b"\n") + 1
            data = data[: end or (len(data) if hit else 0)]
        if not data:
            return hit
        cursor.offset += len(data)
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        tally = Tally(label, lines=cursor.line)
        out.extend(scan(lines, tally))
        self.lines += tally.lines - cursor.line
        self.malformed += tally.malformed
        cursor.line = tally.lines
        self._dirty = True
        return hit


def _identity_at(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _open_plain(path: str, label: str) -> BinaryIO | None:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - held open across polls
    except FileNotFoundError:
        return None  # replaced between stat and open: the next poll sees the new one
    except OSError as exc:
        raise FollowError(f"{label}: cannot read ({exc.strerror})") from exc
    if fh.read(2) == GZIP_MAGIC:
        fh.close()
        raise FollowError(f"{label}: a .gz file is history; run detect on it without --follow")
    return fh


def _open_inode(path: str, dev: int, ino: int) -> BinaryIO | None:
    """The file that was at ``path`` at the checkpoint: still there, or rotated beside it."""
    directory = os.path.dirname(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    base = os.path.basename(path)
    candidates = [path, *sorted(os.path.join(directory, n) for n in names if n.startswith(base))]
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            try:
                return open(candidate, "rb")
            except OSError:
                return None
    return None
