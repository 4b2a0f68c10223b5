"""Check I1 and I2 over a whole log, and say how much was checked.

I1 (ownership): every applied mutating call lies inside its owner's lease: when its
line was written, the slot's current generation was the call's, leased to the call's
job *and attempt*, not yet released, and the receipt is the call's own job's.
I2 (at most once): every idempotency key was applied at most once.

The same timelines and rules as ``ops.detect.detector`` (:class:`ops.detect.detector.Replay`), with
two differences: every line is parsed (no pre-filter, so no spelling of an apply can
slip past), and every verdict counts, including the two detect does not page on
(``wrong_attempt_apply``, ``after_release_apply``). Malformed lines are counted, not
violations: a torn line is an absent record, never a phantom apply.

With ``receipts`` (a slots directory), every slot's receipts, rotated and hot, are
checked too (:mod:`ops.detect.receipts_audit`): their violations count with the log's,
an unreadable receipt file is unusable input, and the proof says how much was read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.detect.detector import Incident, Kind, Malformed, Replay, judge_records, read_records
from ops.detect.receipts_audit import ReceiptAudit, ReceiptViolation, audit


@dataclass(frozen=True)
class Proof:
    lines: int
    malformed: int
    leases: int
    releases: int
    applies: int
    keys: int
    violations: dict[str, int]
    unusable: dict[str, str]  # path -> why
    receipts: ReceiptAudit | None = None  # None: the receipts were not read

    @property
    def holds(self) -> bool:
        return not any(self.violations.values())

    @property
    def exit_code(self) -> int:
        return 2 if self.unusable else 0 if self.holds else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "summary",
            "holds": self.holds,
            "lines": self.lines,
            "malformed": self.malformed,
            "leases": self.leases,
            "releases": self.releases,
            "applies": self.applies,
            "keys": self.keys,
            "violations": self.violations,
            "unusable": self.unusable,
            **({} if self.receipts is None else {"receipts": self.receipts.to_json()}),
        }


def verify(
    paths: Sequence[str],
    on_item: Callable[[Incident | Malformed], None] = lambda _: None,
    *,
    receipts: Path | None = None,
    on_receipt: Callable[[ReceiptViolation], None] = lambda _: None,
) -> Proof:
    """Replay every input merged by ``ts``; each violation and malformed line goes to
    on_item. With ``receipts``, audit every slot under it too (to on_receipt)."""
    records, tallies = read_records(paths, prefilter=False)
    replay = Replay()
    violations = dict.fromkeys(map(str, Kind), 0)
    for item in judge_records(records, replay, Kind):
        if isinstance(item, Incident):
            violations[item.kind] += 1
        on_item(item)
    unusable = {t.label: t.problem for t in tallies if t.problem is not None}
    checked = None if receipts is None else audit(receipts, on_receipt)
    if checked is not None:
        violations.update(checked.violations)
        unusable.update(checked.unusable)
    return Proof(
        lines=sum(t.lines for t in tallies),
        malformed=sum(t.malformed for t in tallies),
        leases=replay.leases,
        releases=replay.releases,
        applies=replay.applies,
        keys=len(replay.keys),
        violations=violations,
        unusable=unusable,
        receipts=checked,
    )
