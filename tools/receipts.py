"""The per-slot apply receipt store: ``slots/<slot_id>/receipts.jsonl`` (DESIGN §2 I2/I3, §4).

One JSON object per line, append-only. A mutating call writes an ``intent`` line,
durably, before its effect and an outcome line (``applied`` or ``failed``) after it::

    store = ReceiptStore(slot_dir)
    began = store.begin(key=..., job_id=..., attempt=..., slot_id=..., generation=..., tool=...)
    if began.fresh:                      # a new intent is on disk: apply the effect now
        ...
        receipt = store.finish(began.receipt, Status.APPLIED, digest=...)
    elif began.receipt.status is Status.INTENT:
        ...                              # outcome unknown: resolve it from the tree first
    else:
        receipt = began.receipt          # a replay: the original receipt, nothing applied

Concurrency: every read-check-append holds an exclusive ``flock`` on ``receipts.lock``
(the tool server, the janitor in a worker process and the recovery step share the
file) plus a thread lock (threads of one process share this object). The lock file
and ``receipts.jsonl`` are each opened once per store and process and kept open:
a record costs one ``flock`` pair, one ``write`` and one ``fsync``
(:func:`runner.durable.append_record_fd`), not an open, a lock-file dance and a
close. A forked child drops the descriptors it inherited and opens its own, so a
parent and child never share one open file description (which would make their
``flock`` calls not exclude each other).

There is no group commit: every writer of a slot's receipts (the tool server and
the janitor) already holds the slot's lock for the whole call, so two records of one
slot are never pending together; concurrent slots fsync their own files in parallel.

The in-memory index is refreshed by reading only the bytes appended since the last
read, so a lookup costs O(new bytes), not O(file); when the file still ends where
this store's own last record ended (one ``stat``), nothing is read at all. A record
this store appends is folded into the index from the value it wrote, not read back:
under the lock its line is known to be the last one (the ``O_APPEND`` offset after
the write says where it ended), so the file and the index cannot disagree.

Errors (all :class:`tools.reasons.ToolError`)::

    ToolError
     +-- KeyBoundToOtherJob        key_bound_to_other_job: the key names another job
     +-- ReceiptDurabilityError    outcome_unknown: a write or fsync failed (never retried)
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner.durable import append_record_fd, open_append
from tools.reasons import Reason, ToolError

RECEIPTS_FILE = "receipts.jsonl"
LOCK_FILE = "receipts.lock"

# Written before the next record when the file ends in an unterminated (torn) line.
# A bare "\n" is not enough: a torn tail can be a complete JSON object that lost only
# its newline (its fsync never returned, so its caller never applied anything), and a
# bare "\n" would turn it into a valid record for every later reader -- a phantom
# intent or apply. " #torn" can never continue a JSON text (no quote closes an open
# string, "#" is not JSON outside one), so the torn line stays malformed for good.
# Marker and record go in one append_record write, so no reader sees one without the other.
TORN_TERMINATOR = b" #torn\n"


def utc_now() -> datetime:
    return datetime.now(UTC)


class Status(StrEnum):
    INTENT = "intent"
    APPLIED = "applied"
    FAILED = "failed"


class Receipt(BaseModel):
    """One line of ``receipts.jsonl``. Field order is the on-disk order of DESIGN §4."""

    # extra="ignore": a valid record carrying a field from a newer version must still
    # count as present; reading it as absent could let the key be applied a second time.
    # ser_json_inf_nan: a NaN in a result is written as NaN (as json.dumps would), not
    # silently turned into null.
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    key: str = Field(min_length=1)
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    slot_id: str = Field(min_length=1)
    generation: int = Field(ge=0)
    tool: str = Field(min_length=1)
    relpath: str | None = None
    digest: str | None = None
    status: Status
    ts: str
    detail: str | None = None
    result: dict[str, Any] | None = None
    pre_digest: str | None = None
    patch_sha256: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """A JSON-able dict without the fields that are ``None``."""
        return self.model_dump(mode="json", exclude_none=True)


class KeyBoundToOtherJob(ToolError):
    """The idempotency key already belongs to another job (I2: bound forever)."""

    reason = Reason.KEY_BOUND_TO_OTHER_JOB


class ReceiptDurabilityError(ToolError):
    """A receipt write or fsync failed: the record's fate is unknown; poison the slot."""

    reason = Reason.OUTCOME_UNKNOWN


@dataclass(frozen=True)
class Begin:
    """``fresh``: a new intent was written, apply now. Otherwise ``receipt`` is the
    existing outcome (a replay) or an open intent the caller must resolve first."""

    receipt: Receipt
    fresh: bool


@dataclass
class _KeyState:
    job_id: str  # the job of the key's first record: the binding never changes
    intent: Receipt | None = None
    outcome: Receipt | None = None


def _latest(state: _KeyState) -> Receipt | None:
    return state.outcome if state.outcome is not None else state.intent


def _parse_line(raw: bytes) -> Receipt | None:
    """A record, or ``None`` for anything that is not one whole valid record."""
    if not raw.endswith(b"\n"):
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting
        return None
    if not isinstance(obj, dict):
        return None
    try:
        return Receipt.model_validate(obj)
    except ValueError:  # pydantic's ValidationError
        return None


def _encode(receipt: Receipt) -> bytes:
    """The record line of ``receipt``: compact JSON, ASCII only, ``None`` fields left out."""
    text: str | None
    try:
        # pydantic-core writes the JSON in one call (a record is encoded on every
        # durable write); its output is used when it is plain ASCII, as lines are.
        text = receipt.model_dump_json(exclude_none=True)
    except ValueError:  # e.g. a lone surrogate, which only an escape can carry
        text = None
    if text is None or not text.isascii():
        try:
            text = json.dumps(receipt.to_wire(), separators=(",", ":"), ensure_ascii=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"receipt for key {receipt.key!r} is not JSON-serialisable: {exc}"
            ) from exc
    return text.encode("ascii") + b"\n"


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
_LIVE: weakref.WeakSet[ReceiptStore] = weakref.WeakSet()


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


os.register_at_fork(after_in_child=_after_fork)


class ReceiptStore:
    """The receipts of one slot; safe across threads and processes."""

    def __init__(self, slot_dir: Path, clock: Callable[[], datetime] = utc_now) -> None:
        # Not created here: a slot dir made on the fly would not be durable in its
        # parent, and a wrong path should fail loudly rather than grow a new slot.
        if not slot_dir.is_dir():
            raise FileNotFoundError(f"slot directory {slot_dir} does not exist")
        self.path = slot_dir / RECEIPTS_FILE
        self._dir = str(slot_dir)
        self._file = str(self.path)
        self._lock_file = str(slot_dir / LOCK_FILE)
        self._clock = clock
        self._thread_lock = threading.Lock()
        self._handles = _Handles()
        weakref.finalize(self, self._handles.close)
        self._broken: str | None = None  # set once a write failed: never write again
        self._forget()
        _LIVE.add(self)

    def _forget(self) -> None:
        """Drop everything read from the file; the next use reads it from the start."""
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file seen
        self._index: dict[str, _KeyState] = {}
        self._offset = 0  # end of the last complete line read
        self._seen_size = 0  # file size at the last read (includes a torn tail)
        self._tail_torn = False  # the file ends in bytes without a newline
        self._malformed = 0  # complete lines that are not records

    def close(self) -> None:
        """Close the kept-open descriptors (they reopen on the next use)."""
        with self._thread_lock:
            self._handles.close()

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

    def begin(
        self,
        *,
        key: str,
        job_id: str,
        attempt: int,
        slot_id: str,
        generation: int,
        tool: str,
        relpath: str | None = None,
        digest: str | None = None,
        pre_digest: str | None = None,
        patch_sha256: str | None = None,
    ) -> Begin:
        """Bind ``key`` to ``job_id`` and write its intent, unless it has records already."""
        self._acquire()
        try:
            self._refresh()
            state = self._index.get(key)
            if state is not None:
                if state.job_id != job_id:
                    raise KeyBoundToOtherJob(
                        f"idempotency key {key!r} is bound to job {state.job_id!r}, not {job_id!r}"
                    )
                existing = _latest(state)
                if existing is not None:
                    return Begin(receipt=existing, fresh=False)
            intent = Receipt(
                key=key,
                job_id=job_id,
                attempt=attempt,
                slot_id=slot_id,
                generation=generation,
                tool=tool,
                relpath=relpath,
                digest=digest,
                status=Status.INTENT,
                ts=self._now(),
                pre_digest=pre_digest,
                patch_sha256=patch_sha256,
            )
            return Begin(receipt=self._append(intent), fresh=True)
        finally:
            self._release()

    def finish(
        self,
        intent: Receipt,
        status: Status,
        *,
        digest: str | None = None,
        detail: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> Receipt:
        """Write the outcome of ``intent``; durable when this returns.

        If the key already has an outcome (another process resolved it first), that
        outcome is returned and nothing is written: a key has at most one outcome.
        """
        if intent.status is not Status.INTENT:
            raise ValueError(f"finish() needs an intent, got a {intent.status} receipt")
        if status is Status.INTENT:
            raise ValueError("finish() writes an outcome: status must be applied or failed")
        self._acquire()
        try:
            self._refresh()
            state = self._index.get(intent.key)
            if state is None or state.intent is None:
                raise ValueError(f"no intent is recorded for key {intent.key!r}")
            if state.job_id != intent.job_id:
                raise KeyBoundToOtherJob(
                    f"idempotency key {intent.key!r} is bound to job {state.job_id!r}, "
                    f"not {intent.job_id!r}"
                )
            if state.outcome is not None:
                return state.outcome
            # Validated like a line read back (and the result dict copied: the index
            # must not change when the caller later changes its own dict).
            outcome = Receipt.model_validate(
                {
                    **intent.__dict__,
                    "status": status,
                    "ts": self._now(),
                    "digest": digest if digest is not None else intent.digest,
                    "detail": detail,
                    "result": result,
                }
            )
            return self._append(outcome)
        finally:
            self._release()

    def lookup(self, key: str) -> Receipt | None:
        """The key's outcome if it has one, else its open intent, else ``None``."""
        with self._locked():
            self._refresh()
            state = self._index.get(key)
            return None if state is None else _latest(state)

    def open_intents(self) -> list[Receipt]:
        """Intents with no outcome (outcome unknown), in file order: for recovery."""
        with self._locked():
            self._refresh()
            return [
                s.intent for s in self._index.values() if s.intent is not None and s.outcome is None
            ]

    def records(self) -> Iterator[Receipt]:
        """Every valid record in file order (for audit); garbage and torn lines skipped."""
        with self._locked():
            self._refresh()
            end = self._offset
        # Bytes before ``end`` are complete lines and, the file being append-only,
        # never change: stream them without holding the lock.
        return self._stream(end)

    # -- edges ---------------------------------------------------------------------

    def _acquire(self) -> None:
        self._thread_lock.acquire()
        try:
            fd = self._handles.lock_fd
            if fd is None:
                fd = self._handles.lock_fd = os.open(
                    self._lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
                )
            # Blocking: the kernel wakes us when the holder unlocks (or dies: a dead
            # process's flock goes with its descriptors), no polling interval.
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def _release(self) -> None:
        try:
            if self._handles.lock_fd is not None:
                fcntl.flock(self._handles.lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _now(self) -> str:
        moment = self._clock()
        if moment.tzinfo is not UTC:
            if moment.tzinfo is None:
                raise ValueError(
                    "the receipt clock returned a naive datetime; it must be UTC-aware"
                )
            moment = moment.astimezone(UTC)
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _refresh(self) -> None:
        """Fold the lines appended since the last read into the index (lock held)."""
        try:
            st = os.stat(self._file)
        except FileNotFoundError:
            if self._identity is not None:
                # The kept-open descriptor would append to a file no reader can find:
                # records acknowledged as durable, then lost to every lookup.
                raise ReceiptDurabilityError(
                    f"{self.path} vanished after {self._seen_size} bytes; receipts lost"
                ) from None
            return
        identity = (st.st_dev, st.st_ino)
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity:
            # Moved aside or replaced: the same danger, and what was read may be gone.
            raise ReceiptDurabilityError(
                f"{self.path} was replaced by another file; the receipts read so far are gone"
            )
        size = st.st_size
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
                receipt = _parse_line(raw)
                if receipt is None:
                    self._malformed += 1
                else:
                    self._fold(receipt)
            self._seen_size = f.tell()

    def _fold(self, receipt: Receipt) -> None:
        state = self._index.get(receipt.key)
        if state is None:
            state = self._index[receipt.key] = _KeyState(job_id=receipt.job_id)
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
            fd = open_append(self.path)
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

        Returns ``receipt``, now in the index.
        """
        if self._broken is not None:
            # A second fsync after a failed one can report success for pages the
            # kernel already dropped, so this store writes nothing more.
            raise ReceiptDurabilityError(
                f"{self.path} is not written after an earlier failure: {self._broken}"
            )
        record = _encode(receipt)
        torn = self._tail_torn
        line = TORN_TERMINATOR + record if torn else record
        try:
            end = append_record_fd(self._append_fd(), line, self._dir)
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
        # record we wrote instead of reading and parsing it back.
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
                receipt = _parse_line(raw)
                if receipt is not None:
                    yield receipt
