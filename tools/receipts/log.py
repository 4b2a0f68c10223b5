"""The append-only file under the receipt store: ``slots/<slot_id>/receipts.jsonl``.

:class:`ReceiptLog` is what :class:`tools.receipts.store.ReceiptStore` builds on: the locks,
the kept-open descriptors, the in-memory index by key (first binding, first intent,
first outcome) and the durable append. What to write (intent before effect, one
outcome) is the store's; the line format is :mod:`tools.receipts.format`.

Concurrency: every read-check-append holds an exclusive ``flock`` on ``receipts.lock``
(the tool server, the janitor in a worker process and the recovery step share the
file) plus a thread lock (threads of one process share this object). The lock file
and ``receipts.jsonl`` are each opened once per store and process and kept open:
a record costs one ``flock`` pair, a ``stat`` and one synced ``write`` (``RWF_DSYNC``,
:func:`runner.core.durable.append_record_fd`), not an open, a lock-file dance and a
close. Of those, only the synced write lets go of the interpreter lock: the ``flock``
pair (when the lock is free), the ``stat`` and the ``lseek`` after the write go
through :mod:`runner.core.heldcalls`, so eight slots writing at once do not hand the
interpreter lock around four more times a record.

A forked child drops the descriptors it inherited and opens its own, so a parent and
child never share one open file description (which would make their
``flock`` calls not exclude each other).

There is no group commit: every writer of a slot's receipts (the tool server and
the janitor) already holds the slot's lock for the whole call, so two records of one
slot are never pending together; concurrent slots sync their own files in parallel.

The file is the slot's *hot* file: a new lease rotates its settled records into the
slot's archive (``tools.receipts.archive``), and a key the index lacks is asked of
the archive. A store that finds the file replaced follows it only when the archive's
marker names the new file (a rotation); any other replacement is a loss.

The in-memory index is refreshed by reading only the bytes appended since the last
read, so a lookup costs O(new bytes), not O(file); when the file still ends where
this store's own last record ended (one ``stat``), nothing is read at all. A record
this store appends is folded into the index as its line decodes (the line it wrote,
not read back from the file): under the lock its line is known to be the last one
(the ``O_APPEND`` offset after the write says where it ended), so the file and the
index cannot disagree.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from runner.core import heldcalls
from runner.core.durable import Fsync, append_record_fd, open_append, os_fsync
from tools.errors import ToolError
from tools.reasons import Reason
from tools.receipts.archive import Archive
from tools.receipts.format import TORN_TERMINATOR, Receipt, Status, parse_line, record_of

RECEIPTS_FILE = "receipts.jsonl"
LOCK_FILE = "receipts.lock"


class ReceiptDurabilityError(ToolError):
    """A receipt write or fsync failed: the record's fate is unknown; poison the slot."""

    reason = Reason.OUTCOME_UNKNOWN


@dataclass
class KeyState:
    """One key in the index: the job it is bound to, its first intent and first outcome."""

    job_id: str  # the job of the key's first record: the binding never changes
    intent: Receipt | None = None
    outcome: Receipt | None = None


class _Handles:
    """The descriptors a store keeps open; closed when the store is collected.

    A separate object so the finalizer and the at-fork hook never hold the store.
    """

    def __init__(self) -> None:
        self.lock_fd: int | None = None
        self.append_fd: int | None = None

    def close(self) -> None:
        for fd in (self.lock_fd, self.append_fd):
            if fd is not None:
                with suppress(OSError):
                    os.close(fd)
        self.lock_fd = self.append_fd = None


# Every live store, so a forked child can drop what it inherited (see _after_fork).
_LIVE: weakref.WeakSet[ReceiptLog] = weakref.WeakSet()


def _after_fork() -> None:
    # The child shares the parent's open file descriptions: a flock taken through one
    # would not exclude the parent. Close the child's copies (the parent's stay open
    # and locked as they were) and start over with fresh ones on the next record. The
    # thread lock may have been held by a thread that does not exist in the child.
    # The index is rebuilt from the file too: a parent thread may have been halfway
    # through folding lines into it when the fork copied it.
    for store in list(_LIVE):
        store._handles.close()
        store._thread_lock = threading.Lock()
        store._forget()
        store._archive.close()  # the parent's connection is left alone: see Archive


os.register_at_fork(after_in_child=_after_fork)


class ReceiptLog:
    """The receipts file of one slot and its index by key; safe across threads and processes."""

    def __init__(self, slot_dir: Path, *, fsync: Fsync = os_fsync) -> None:
        # Not created here: a slot dir made on the fly would not be durable in its
        # parent, and a wrong path should fail loudly rather than grow a new slot.
        if not slot_dir.is_dir():
            raise FileNotFoundError(f"slot directory {slot_dir} does not exist")
        self.path = slot_dir / RECEIPTS_FILE
        self._dir = str(slot_dir)
        self._file = str(self.path)
        self._watch = heldcalls.PathWatch(self._file)
        self._lock_file = str(slot_dir / LOCK_FILE)
        self._fsync = fsync
        self._thread_lock = threading.Lock()
        self._handles = _Handles()
        weakref.finalize(self, self._handles.close)
        self._broken: str | None = None  # set once a write failed: never write again
        self._archive = Archive(slot_dir, fsync=fsync)
        self._forget()
        _LIVE.add(self)

    def _forget(self) -> None:
        """Drop everything read from the file; the next use reads it from the start,
        and looks for the archive again (a rotation may have made it meanwhile)."""
        self._archive.recheck()
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file seen
        self._index: dict[str, KeyState] = {}
        self._offset = 0  # end of the last complete line read
        self._seen_size = 0  # file size at the last read (includes a torn tail)
        self._tail_torn = False  # the file ends in bytes without a newline
        self._malformed = 0  # complete lines that are not records

    def close(self) -> None:
        """Close the kept-open descriptors and the archive (they reopen on the next use)."""
        with self._thread_lock:
            self._handles.close()
            self._archive.close()

    @property
    def broken(self) -> str | None:
        """Why this store refuses to write (a failed write or fsync), or None."""
        return self._broken

    @property
    def torn_lines(self) -> int:
        """Lines ignored as absent: garbage lines plus an unterminated torn tail."""
        with self._locked():
            self._refresh()
            return self._malformed + int(self._tail_torn)

    def records(self) -> Iterator[Receipt]:
        """Every valid record, the archive's segments first, then the hot file in file
        order (for audit); garbage and torn lines skipped."""
        with self._locked():
            self._refresh()
            end = self._offset
            segments = self._archive.segments()
        # Segments are written once (a crashed rotation's is rewritten whole, by rename),
        # and bytes before ``end`` are complete lines of an append-only file: stream
        # them without holding the lock.
        yield from self._archive.records(segments)
        yield from self._stream(end)

    # -- edges ---------------------------------------------------------------------

    def _acquire(self) -> None:
        self._thread_lock.acquire()
        try:
            fd = self._handles.lock_fd
            if fd is None:
                fd = self._handles.lock_fd = os.open(
                    self._lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
                )
            # At once when free, without letting go of the interpreter lock; else
            # blocking: the kernel wakes us when the holder unlocks (or dies: a dead
            # process's flock goes with its descriptors), no polling interval.
            heldcalls.lock_exclusive(fd)
        except BaseException:
            self._thread_lock.release()
            raise

    def _release(self) -> None:
        try:
            if self._handles.lock_fd is not None:
                heldcalls.unlock(self._handles.lock_fd)
        finally:
            self._thread_lock.release()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _refresh(self) -> None:
        """Fold the lines appended since the last read into the index (lock held)."""
        try:
            st = self._watch.state()
        except FileNotFoundError:
            if self._identity is not None:
                # The kept-open descriptor would append to a file no reader can find:
                # records acknowledged as durable, then lost to every lookup.
                raise ReceiptDurabilityError(
                    f"{self.path} vanished after {self._seen_size} bytes; receipts lost"
                ) from None
            return
        identity = (st.dev, st.ino)
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity:
            if self._archive.marker() != identity:
                # Moved aside or replaced: the same danger, and what was read may be gone.
                raise ReceiptDurabilityError(
                    f"{self.path} was replaced by another file; the receipts read so far are gone"
                )
            # Rotated by another process: what was read is in the archive now.
            self._restart_at(identity)
        size = st.size
        if size == self._seen_size:
            return
        if size < self._seen_size:
            # Receipts are never truncated by us; a shrunk file lost records, so no
            # answer from it can be trusted.
            raise ReceiptDurabilityError(
                f"{self.path} shrank from {self._seen_size} to {size} bytes; receipts lost"
            )
        with open(self._file, "rb") as f:
            f.seek(self._offset)
            self._tail_torn = False
            for raw in f:
                if not raw.endswith(b"\n"):
                    # Every live writer holds the lock for its whole line, so bytes
                    # without a newline here are a crashed write: absent, not pending.
                    self._tail_torn = True
                    break
                self._offset += len(raw)
                receipt = parse_line(raw)
                if receipt is None:
                    self._malformed += 1
                else:
                    self._fold(receipt)
            self._seen_size = f.tell()

    def _restart_at(self, identity: tuple[int, int]) -> None:
        """Follow a rotation to the new hot file ``identity``: read it from the start."""
        fd, self._handles.append_fd = self._handles.append_fd, None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)
        self._forget()
        self._identity = identity

    def rotate(self) -> int | None:
        """Move every record out of the hot file into the archive (archive.py); the
        caller holds the slot's lock. The number of keys moved; None, and nothing
        moved, when an intent is open (it must be settled in the hot file first), the
        file is empty, or the store is broken. Raises ``OSError`` as
        :meth:`Archive.rotate` does."""
        with self._locked():
            self._refresh()
            if self._broken is not None or self._identity is None or not self._seen_size:
                return None
            last: dict[str, Receipt] = {}
            for key, state in self._index.items():
                if state.outcome is None:
                    return None  # an open intent stays where recovery reads it
                last[key] = state.outcome
            with open(self._file, "rb") as f:
                raw = f.read(self._seen_size)
            self._restart_at(self._archive.rotate(self.path, self._identity, raw, last))
            return len(last)

    def _fold(self, receipt: Receipt) -> None:
        state = self._index.get(receipt.key)
        if state is None:
            state = self._index[receipt.key] = KeyState(job_id=receipt.job_id)
        if receipt.job_id != state.job_id:
            return  # only a foreign writer could produce this; the first binding stands
        if receipt.status is Status.INTENT:
            if state.intent is None:
                state.intent = receipt
        elif state.outcome is None:
            state.outcome = receipt  # the first outcome is the one that counts

    def _append_fd(self) -> int:
        """The kept-open ``O_APPEND`` descriptor, opened (and the file made) on first use."""
        fd = self._handles.append_fd
        if fd is None:
            fd = open_append(self.path, fsync=self._fsync)
            st = os.fstat(fd)
            if self._identity is None:
                self._identity = (st.st_dev, st.st_ino)
            elif (st.st_dev, st.st_ino) != self._identity:
                os.close(fd)
                raise ReceiptDurabilityError(
                    f"{self.path} was replaced by another file; the receipts read so far are gone"
                )
            self._handles.append_fd = fd
        return fd

    def _append(self, receipt: Receipt) -> Receipt:
        """Durably append the line of ``receipt`` (lock held, index fresh); never retried.

        Returns the record as the file holds it (read back from its line: see
        :func:`tools.receipts.format.record_of`), now in the index; ``ValueError``,
        and nothing written, when ``receipt`` is not a valid record.
        """
        if self._broken is not None:
            # A second fsync after a failed one can report success for pages the
            # kernel already dropped, so this store writes nothing more.
            raise ReceiptDurabilityError(
                f"{self.path} is not written after an earlier failure: {self._broken}"
            )
        receipt, encoded = record_of(receipt)
        torn = self._tail_torn
        line = TORN_TERMINATOR + encoded if torn else encoded
        try:
            end = append_record_fd(self._append_fd(), line, self._dir, fsync=self._fsync)
        except OSError as exc:  # DurabilityError, or a failed open/write: fate unknown
            self._broken = f"{type(exc).__name__}: {exc}"
            raise ReceiptDurabilityError(
                f"receipt for key {receipt.key!r} may or may not be on disk "
                f"({self._broken}); the slot must be poisoned"
            ) from exc
        if end != self._seen_size + len(line):
            # Someone appended without the lock: read everything back from the file.
            self._refresh()
            return receipt
        # Our line is the file's last and follows everything already folded: fold the
        # record decoded from it instead of reading it back from the file.
        if torn:
            self._malformed += 1  # the torn tail, now closed by TORN_TERMINATOR
            self._tail_torn = False
        self._fold(receipt)
        self._offset = self._seen_size = end
        return receipt

    def _stream(self, end: int) -> Iterator[Receipt]:
        if end == 0:
            return
        with open(self.path, "rb") as f:
            pos = 0
            for raw in f:
                if pos >= end:
                    break
                pos += len(raw)
                receipt = parse_line(raw)
                if receipt is not None:
                    yield receipt
