"""Find ownership and at-most-once violations in slotrunner's JSONL event logs.

An *apply* is a ``tool_result`` line with ``outcome == "applied"`` on a tool in
``MUTATING_TOOLS``; nothing else is judged. Each apply is checked against the
ownership timeline of its ``(host, slot_id)`` (slot ids repeat across hosts), rebuilt
from ``slot_leased`` / ``slot_released`` lines in log order:

==========================  =====================================================
``stale_generation_apply``  its generation is below the slot's current one: a newer
                            generation had been leased before the line was written
``cross_job_apply``         its ``receipt_job`` is not its ``job_id``, or its job is
                            not the job holding the lease of that generation
``unowned_apply``           that generation of that slot was never leased in the
                            logs read (slot unseen, or generation ahead of the lease)
``duplicate_apply``         its idempotency key was applied before (``replayed``
                            lines are the cure, not the disease: they never count)
==========================  =====================================================

Precedence: an apply gets at most one *ownership* kind, stale > cross_job > unowned.
Stale wins because a recycled slot explains everything else about the line; a
foreign receipt outranks "unowned" because it names the victim. ``duplicate_apply``
is judged on its own, so the replayed buffered apply of docs/architecture.md §Problem
(old envelope, same key) is two incidents on one line: stale_generation_apply and duplicate_apply.
:func:`judge_apply` also returns two kinds only ``ops.detect.verify`` reports (the owner's
job with another attempt, and an apply after the lease was released).

Memory is constant in the number of lines: one small tuple per (host, slot), and one
8-byte fingerprint per distinct applied key (:class:`ops.detect.keys.KeySet`). The key set
is the one thing that must grow: "applied at most once, ever" cannot be checked with
less. The logs read must reach back to the leases they judge: an apply whose lease
is in an older, unread file is an ``unowned_apply``. Reading is :mod:`ops.detect.inputs`'
and :mod:`ops.detect.scan`'s job; this module is the rules and the replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any, NamedTuple

from ops.detect.inputs import expand, merge_by_ts, read_batches, read_records
from ops.detect.keys import AppliedKeys, KeySet, expected_keys
from ops.detect.records import (
    APPLY_TYPES,
    MALFORMED,
    AppliedLine,
    Apply,
    ApplyRecord,
    Lease,
    LeaseRecord,
    Malformed,
    Record,
    parse_line,
)
from ops.detect.scan import GZIP_MAGIC, Batch, Tally, scan
from runner.core.events import OUTCOME_APPLIED
from tools.names import MUTATING_TOOLS

__all__ = [  # the reader's names and the key set, re-exported for callers that predate them
    "GZIP_MAGIC",
    "MALFORMED",
    "Apply",
    "Batch",
    "KeySet",
    "Lease",
    "Malformed",
    "Record",
    "Tally",
    "expand",
    "expected_keys",
    "merge_by_ts",
    "parse_line",
    "read_batches",
    "read_records",
    "scan",
]


class Kind(StrEnum):
    STALE = "stale_generation_apply"
    CROSS_JOB = "cross_job_apply"
    UNOWNED = "unowned_apply"
    DUPLICATE = "duplicate_apply"
    # Reported by ops.detect.verify only: inside the right generation, outside the lease.
    WRONG_ATTEMPT = "wrong_attempt_apply"
    AFTER_RELEASE = "after_release_apply"


DETECT_KINDS = (Kind.STALE, Kind.CROSS_JOB, Kind.UNOWNED, Kind.DUPLICATE)


# -- rules (pure) ------------------------------------------------------------------


class SlotState(NamedTuple):
    """What the log has said about one (host, slot) so far."""

    generation: int
    job_id: str
    attempt: int
    leased: bool  # False when the only line seen for this generation is its release
    released: bool


def after_lease(slot: SlotState | None, lease: LeaseRecord) -> SlotState:
    """The slot after a ``slot_leased`` or ``slot_released`` line."""
    if slot is not None and lease.generation < slot.generation:
        return slot  # an older generation's line arriving late (skew between merged files)
    if not lease.released:
        return _slot((lease.generation, lease.job_id, lease.attempt, True, False))
    if slot is not None and lease.generation == slot.generation:
        return slot._replace(released=True)
    return _slot((lease.generation, lease.job_id, lease.attempt, False, True))


_slot = SlotState._make  # (generation, job_id, attempt, leased, released): no keyword parsing


def judge_apply(slot: SlotState | None, apply: ApplyRecord) -> Kind | None:
    """The ownership verdict on one apply; None when it lies inside its owner's lease."""
    if slot is not None and apply.generation < slot.generation:
        return Kind.STALE
    if apply.receipt_job is not None and apply.receipt_job != apply.job_id:
        return Kind.CROSS_JOB
    if slot is None or apply.generation > slot.generation or not slot.leased:
        return Kind.UNOWNED
    if apply.job_id != slot.job_id:
        return Kind.CROSS_JOB
    if apply.attempt != slot.attempt:
        return Kind.WRONG_ATTEMPT
    if slot.released:
        return Kind.AFTER_RELEASE
    return None


class Replay:
    """Every (host, slot) timeline and the applied keys: all the state the rules need."""

    def __init__(self, keys: AppliedKeys | None = None) -> None:
        self.slots: dict[tuple[str, str], SlotState] = {}
        self.keys: AppliedKeys = keys if keys is not None else KeySet()
        self.leases = self.releases = self.applies = 0

    def lease(self, lease: LeaseRecord) -> None:
        where = (lease.host, lease.slot_id)
        self.slots[where] = after_lease(self.slots.get(where), lease)
        if lease.released:
            self.releases += 1
        else:
            self.leases += 1

    def judge(self, apply: ApplyRecord) -> tuple[Kind, ...]:
        """Every kind this apply is, at most one ownership kind plus duplicate."""
        self.applies += 1
        kind = judge_apply(self.slots.get((apply.host, apply.slot_id)), apply)
        if self.keys.add(apply.key):
            return (Kind.DUPLICATE,) if kind is None else (kind, Kind.DUPLICATE)
        return () if kind is None else (kind,)

    def snapshot(self) -> dict[str, Any]:
        """The timelines and counters as JSON (the key set is persisted by its owner)."""
        return {
            "slots": [[host, slot, *state] for (host, slot), state in self.slots.items()],
            "counts": [self.leases, self.releases, self.applies],
        }

    @classmethod
    def restore(cls, snap: dict[str, Any], keys: AppliedKeys) -> Replay:
        replay = cls(keys)
        for host, slot, *state in snap["slots"]:
            replay.slots[(host, slot)] = SlotState(*state)
        replay.leases, replay.releases, replay.applies = snap["counts"]
        return replay


class Incident(NamedTuple):
    kind: str
    path: str
    line: int
    job_id: str
    slot_id: str
    generation: int
    tool: str
    idempotency_key: str
    host: str
    ts: str

    @classmethod
    def of(cls, kind: Kind, a: ApplyRecord) -> Incident:
        return cls(
            str(kind),
            a.path,
            a.line,
            a.job_id,
            a.slot_id,
            a.generation,
            a.tool,
            a.key,
            a.host,
            a.ts,
        )

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @property
    def dedup_key(self) -> str:
        """The incident's identity without its path: a line re-read after rotation is the same."""
        return ":".join(
            (
                self.kind,
                self.host,
                self.slot_id,
                str(self.generation),
                self.job_id,
                self.idempotency_key,
                self.ts,
            )
        )


def judge_records(
    records: Iterable[Record], replay: Replay, kinds: Iterable[Kind] = DETECT_KINDS
) -> Iterator[Incident | Malformed]:
    """Replay records through the timelines; yield incidents of ``kinds`` and malformed lines."""
    wanted = frozenset(kinds)
    judge, lease = replay.judge, replay.lease
    for rec in records:
        if isinstance(rec, APPLY_TYPES):
            for kind in judge(rec):
                if kind in wanted:
                    yield Incident.of(kind, rec)
        elif isinstance(rec, Malformed):
            yield rec
        else:
            lease(rec)


def judge_batches(
    batches: Iterable[Batch], replay: Replay, kinds: Iterable[Kind] = DETECT_KINDS
) -> Iterator[Incident | Malformed]:
    """:func:`judge_records` over batches, the hot loop of ``ops detect``: a decoded line
    goes to the rules as it is, and gets its path and line only if it is reported.

    The same rules as :meth:`Replay.judge`, unrolled: an apply inside its owner's lease
    (nearly all of them) is settled by one comparison of the slot's state and one key
    insert, without a call per rule; anything else goes to :func:`judge_apply`.
    """
    wanted = frozenset(kinds)
    slots, add, make = replay.slots, replay.keys.add, _slot
    applied, mutating = OUTCOME_APPLIED, MUTATING_TOOLS
    for batch in batches:
        yield from judge_records(batch.records, replay, wanted)
        path, applies, leases, releases = batch.path, 0, 0, 0
        for rec, n in zip(batch.lines, batch.numbers, strict=True):
            if not isinstance(rec, AppliedLine):  # after_lease, unrolled
                where = (rec.host, rec.slot_id)
                slot, gen = slots.get(where), rec.generation
                if not rec.released:
                    leases += 1
                    if slot is None or gen >= slot.generation:
                        slots[where] = make((gen, rec.job_id, rec.attempt, True, False))
                    continue
                releases += 1
                if slot is None or gen > slot.generation:
                    slots[where] = make((gen, rec.job_id, rec.attempt, False, True))
                elif gen == slot.generation and not slot.released:
                    slots[where] = make((gen, slot.job_id, slot.attempt, slot.leased, True))
                continue
            if rec.outcome != applied or rec.tool not in mutating:
                continue
            applies += 1
            slot = slots.get((rec.host, rec.slot_id))
            owned = (
                slot is not None
                and slot.generation == rec.generation
                and slot.leased
                and not slot.released
                and slot.job_id == rec.job_id
                and slot.attempt == rec.attempt
                and (rec.receipt_job is None or rec.receipt_job == rec.job_id)
            )
            kind = None if owned else judge_apply(slot, rec)
            if add(rec.key):
                found: tuple[Kind, ...] = (
                    (Kind.DUPLICATE,) if kind is None else (kind, Kind.DUPLICATE)
                )
            elif kind is None:
                continue
            else:
                found = (kind,)
            rec.path, rec.line = path, n
            yield from (Incident.of(k, rec) for k in found if k in wanted)
        replay.applies += applies
        replay.leases += leases
        replay.releases += releases
