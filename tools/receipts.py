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

Concurrency: every read-check-append holds a ``filelock`` on ``receipts.lock`` (the
tool server's worker processes and the recovery step share the file) plus a thread
lock (threads of one process share this object). There is no group commit: each
record is its own write and fsync, which is simpler and already durable per caller.

The in-memory index is refreshed by reading only the bytes appended since the last
read, so a lookup costs O(new bytes), not O(file).

Errors (all :class:`tools.reasons.ToolError`)::

    ToolError
     +-- KeyBoundToOtherJob        key_bound_to_other_job: the key names another job
     +-- ReceiptDurabilityError    outcome_unknown: a write or fsync failed (never retried)
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from runner.durable import append_record
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
    model_config = ConfigDict(frozen=True, extra="ignore")

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
    try:
        text = json.dumps(receipt.to_wire(), separators=(",", ":"), ensure_ascii=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"receipt for key {receipt.key!r} is not JSON-serialisable: {exc}"
        ) from exc
    return text.encode("ascii") + b"\n"


class ReceiptStore:
    """The receipts of one slot; safe across threads and processes."""

    def __init__(self, slot_dir: Path, clock: Callable[[], datetime] = utc_now) -> None:
        # Not created here: a slot dir made on the fly would not be durable in its
        # parent, and a wrong path should fail loudly rather than grow a new slot.
        if not slot_dir.is_dir():
            raise FileNotFoundError(f"slot directory {slot_dir} does not exist")
        self.path = slot_dir / RECEIPTS_FILE
        self._clock = clock
        self._thread_lock = threading.Lock()
        self._file_lock = FileLock(slot_dir / LOCK_FILE, thread_local=False)
        self._index: dict[str, _KeyState] = {}
        self._offset = 0  # end of the last complete line read
        self._seen_size = 0  # file size at the last read (includes a torn tail)
        self._tail_torn = False  # the file ends in bytes without a newline
        self._malformed = 0  # complete lines that are not records
        self._broken: str | None = None  # set once a write failed: never write again

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
        with self._locked():
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
            self._append(intent)
            return Begin(receipt=intent, fresh=True)

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
        with self._locked():
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
            outcome = intent.model_copy(
                update={
                    "status": status,
                    "ts": self._now(),
                    "digest": digest if digest is not None else intent.digest,
                    "detail": detail,
                    "result": result,
                }
            )
            self._append(outcome)
            return outcome

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

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, self._file_lock:
            yield

    def _now(self) -> str:
        moment = self._clock()
        if moment.tzinfo is None:
            raise ValueError("the receipt clock returned a naive datetime; it must be UTC-aware")
        return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _refresh(self) -> None:
        """Fold the lines appended since the last read into the index (lock held)."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            size = 0
        if size == self._seen_size:
            return
        if size < self._seen_size:
            # Receipts are never truncated by us; a shrunk file lost records, so no
            # answer from it can be trusted.
            raise ReceiptDurabilityError(
                f"{self.path} shrank from {self._seen_size} to {size} bytes; receipts lost"
            )
        with open(self.path, "rb") as f:
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

    def _append(self, receipt: Receipt) -> None:
        """Durably append one record (lock held, index fresh); never retried."""
        if self._broken is not None:
            # A second fsync after a failed one can report success for pages the
            # kernel already dropped, so this store writes nothing more.
            raise ReceiptDurabilityError(
                f"{self.path} is not written after an earlier failure: {self._broken}"
            )
        line = _encode(receipt)
        if self._tail_torn:
            line = TORN_TERMINATOR + line
        try:
            append_record(self.path, line)
        except OSError as exc:  # DurabilityError, or a failed open/write: fate unknown
            self._broken = f"{type(exc).__name__}: {exc}"
            raise ReceiptDurabilityError(
                f"receipt for key {receipt.key!r} may or may not be on disk "
                f"({self._broken}); the slot must be poisoned"
            ) from exc
        self._refresh()

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
