"""The per-slot apply receipt store: ``slots/<slot_id>/receipts.jsonl`` (I2, I3).

The record, its fields and its guarantees: docs/architecture.md §Receipts, §I2, §I3.

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

This module holds that protocol (:class:`ReceiptStore`, :class:`Begin`). The rest is
re-exported from where it lives, so ``tools.receipts.store`` stays the one import path:

- :mod:`tools.receipts.format`: the record (:class:`Receipt`, :class:`Status`), its
  line encoding and ``TORN_TERMINATOR``;
- :mod:`tools.receipts.log`: the file under the store (:class:`ReceiptLog`): locks,
  kept-open descriptors, fork safety, the incremental index and the durable append,
  with ``RECEIPTS_FILE``, ``LOCK_FILE`` and :class:`ReceiptDurabilityError`.

Errors (all :class:`tools.reasons.ToolError`)::

    ToolError
     +-- KeyBoundToOtherJob        key_bound_to_other_job: the key names another job
     +-- ReceiptDurabilityError    outcome_unknown: a write or fsync failed (never retried)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from runner.core.durable import Fsync, os_fsync
from tools.errors import ToolError
from tools.reasons import Reason
from tools.receipts.format import TORN_TERMINATOR, Receipt, Status
from tools.receipts.log import (
    LOCK_FILE,
    RECEIPTS_FILE,
    KeyState,
    ReceiptDurabilityError,
    ReceiptLog,
)

__all__ = [
    "LOCK_FILE",
    "RECEIPTS_FILE",
    "TORN_TERMINATOR",
    "Begin",
    "KeyBoundToOtherJob",
    "Receipt",
    "ReceiptDurabilityError",
    "ReceiptStore",
    "Status",
    "utc_now",
    "utc_stamp",
]


def utc_now() -> datetime:
    return datetime.now(UTC)


# The whole-second part of the last stamp made: a store writes many records a second,
# and building and formatting a datetime costs more than the rest of a stamp.
_second: tuple[int, str] = (-1, "")


def utc_stamp(now_ns: int | None = None) -> str:
    """A record's ``ts`` for the moment ``now_ns`` (nanoseconds since the epoch; default
    now): what the store makes of :func:`utc_now`'s datetime, e.g.
    ``2026-12-07T05:58:33.123456Z``, without building one."""
    global _second
    micros = (time.time_ns() if now_ns is None else now_ns) // 1000
    seconds, fraction = divmod(micros, 1_000_000)
    cached = _second
    if cached[0] != seconds:
        cached = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{cached[1]}.{fraction:06d}Z"


class KeyBoundToOtherJob(ToolError):
    """The idempotency key already belongs to another job (I2: bound forever)."""

    reason = Reason.KEY_BOUND_TO_OTHER_JOB


@dataclass(frozen=True)
class Begin:
    """``fresh``: a new intent was written, apply now. Otherwise ``receipt`` is the
    existing outcome (a replay) or an open intent the caller must resolve first."""

    receipt: Receipt
    fresh: bool


def _latest(state: KeyState) -> Receipt | None:
    return state.outcome if state.outcome is not None else state.intent


class ReceiptStore(ReceiptLog):
    """The receipts of one slot; safe across threads and processes."""

    def __init__(
        self,
        slot_dir: Path,
        clock: Callable[[], datetime] = utc_now,
        *,
        fsync: Fsync = os_fsync,
    ) -> None:
        super().__init__(slot_dir, fsync=fsync)
        self._clock = clock

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
            else:
                # A key of a rotated generation: bound and answered from the archive.
                archived = self._archive.get(key)
                if archived is not None:
                    if archived.job_id != job_id:
                        raise KeyBoundToOtherJob(
                            f"idempotency key {key!r} is bound to job {archived.job_id!r}, "
                            f"not {job_id!r}"
                        )
                    return Begin(receipt=archived, fresh=False)
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
            # Checked, and the result dict copied, as it is read back from its line
            # (_append): the index must not change when the caller changes its dict.
            outcome = msgspec.structs.replace(
                intent,
                status=status,
                ts=self._now(),
                digest=digest if digest is not None else intent.digest,
                detail=detail,
                result=result,
            )
            return self._append(outcome)
        finally:
            self._release()

    def lookup(self, key: str) -> Receipt | None:
        """The key's outcome if it has one, else its open intent, else ``None``."""
        with self._locked():
            self._refresh()
            state = self._index.get(key)
            return self._archive.get(key) if state is None else _latest(state)

    def open_intents(self) -> list[Receipt]:
        """Intents with no outcome (outcome unknown), in file order: for recovery."""
        with self._locked():
            self._refresh()
            return [
                s.intent for s in self._index.values() if s.intent is not None and s.outcome is None
            ]

    def _now(self) -> str:
        if self._clock is utc_now:
            return utc_stamp()
        moment = self._clock()
        if moment.tzinfo is not UTC:
            if moment.tzinfo is None:
                raise ValueError(
                    "the receipt clock returned a naive datetime; it must be UTC-aware"
                )
            moment = moment.astimezone(UTC)
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
