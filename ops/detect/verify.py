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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ops.detect.detector import Incident, Kind, Malformed, Replay, judge_records, read_records


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
        }


def verify(
    paths: Sequence[str], on_item: Callable[[Incident | Malformed], None] = lambda _: None
) -> Proof:
    """Replay every input merged by ``ts``; each violation and malformed line goes to on_item."""
    records, tallies = read_records(paths, prefilter=False)
    replay = Replay()
    violations = dict.fromkeys(map(str, Kind), 0)
    for item in judge_records(records, replay, Kind):
        if isinstance(item, Incident):
            violations[item.kind] += 1
        on_item(item)
    return Proof(
        lines=sum(t.lines for t in tallies),
        malformed=sum(t.malformed for t in tallies),
        leases=replay.leases,
        releases=replay.releases,
        applies=replay.applies,
        keys=len(replay.keys),
        violations=violations,
        unusable={t.label: t.problem for t in tallies if t.problem is not None},
    )
