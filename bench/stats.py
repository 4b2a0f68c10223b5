"""Numbers from timings: runs, interleaving, summaries, ratios and goals.

Speed is measured, not asserted: every figure is a ratio to a baseline measured in
the same process run on the same machine. Arms are interleaved (their order rotates
each repetition: AB, BA, AB, ...), so slow drift of a noisy 2-core machine lands on
both sides of a ratio instead of on one. Ratios are taken per repetition pair, then
the median of the pairs is reported with its spread.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Comparison = Literal["<=", ">=", "<", ">"]


class BenchError(RuntimeError):
    """A benchmark could not measure what it set out to (the message says why)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Run:
    """One repetition of one arm: each operation's duration and the wall time of all."""

    op_s: tuple[float, ...]
    wall_s: float
    ops: int

    @property
    def rate(self) -> float:
        """Operations per second over the wall time (concurrent ops overlap in it)."""
        return self.ops / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def cost_s(self) -> float:
        """Wall seconds per operation: the inverse of the rate."""
        return self.wall_s / self.ops


def timed(
    n: int, op: Callable[[int], object], before: Callable[[int], object] | None = None
) -> Run:
    """Run ``op(i)`` for i in 0..n-1, one at a time; ``before(i)`` runs untimed first."""
    durations: list[float] = []
    wall = 0.0
    for i in range(n):
        if before is not None:
            before(i)
        start = time.perf_counter()
        op(i)
        took = time.perf_counter() - start
        durations.append(took)
        wall += took  # untimed set-up between ops is left out of the wall time too
    return Run(tuple(durations), wall, n)


def interleave(reps: int, arms: dict[str, Callable[[int], Run]]) -> dict[str, list[Run]]:
    """``reps`` repetitions of every arm, the order rotating each repetition."""
    names = list(arms)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(arms[name](rep))
    return runs


def alternate(n: int, ops: dict[str, Callable[[int], object]]) -> dict[str, Run]:
    """``n`` rounds of every op in turn, each op timed on its own: A B, B A, A B, ...

    A finer pairing than :func:`interleave`'s blocks, for arms whose difference is
    small beside how much a block of one arm drifts from the next on a noisy machine
    (a disk's latency swings from one second to the next): here every op of one arm
    sits beside one of the other, in the same second. The order flips each round, so
    neither op always runs right after the other one's I/O.
    """
    names = list(ops)
    durations: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            ops[name](i)
            durations[name].append(time.perf_counter() - start)
    return {name: Run(tuple(d), sum(d), n) for name, d in durations.items()}


def alternate_reps(
    reps: int, n: int, ops: Mapping[str, Callable[[int], object]]
) -> dict[str, list[Run]]:
    """``reps`` repetitions of :func:`alternate` (``n`` rounds each): per arm, one
    :class:`Run` a repetition, as :func:`interleave` gives them."""
    per_rep = [alternate(n, dict(ops)) for _ in range(reps)]
    return {name: [rep[name] for rep in per_rep] for name in ops}


def summarize(runs: Sequence[Run]) -> dict[str, float]:
    """p50 and p99 per operation (all repetitions pooled), median rate over repetitions."""
    pooled = [d for run in runs for d in run.op_s]
    return {
        "p50_ms": round(percentile(pooled, 50) * 1e3, 4),
        "p99_ms": round(percentile(pooled, 99) * 1e3, 4),
        "ops_per_s": round(statistics.median(run.rate for run in runs), 3),
        "runs": len(runs),
        "ops_per_run": runs[0].ops,
    }


def paired(
    subject: Sequence[Run], baseline: Sequence[Run], of: Callable[[Run, Run], float]
) -> tuple[float, float, float]:
    """(median, min, max) of ``of(subject_i, baseline_i)`` over the repetition pairs."""
    values = [of(s, b) for s, b in zip(subject, baseline, strict=True)]
    return statistics.median(values), min(values), max(values)


def cost_ratio(subject: Sequence[Run], baseline: Sequence[Run]) -> tuple[float, float, float]:
    """Subject seconds per op over baseline seconds per op (> 1: the subject is slower)."""
    return paired(subject, baseline, lambda s, b: s.cost_s / b.cost_s)


def rate_ratio(subject: Sequence[Run], baseline: Sequence[Run]) -> tuple[float, float, float]:
    """Subject ops/s over baseline ops/s (> 1: the subject is faster)."""
    return paired(subject, baseline, lambda s, b: s.rate / b.rate)


@dataclass(frozen=True)
class Goal:
    comparison: Comparison
    threshold: float
    text: str  # as the issue states it, e.g. "<= 1.5x the bare baseline"

    def holds(self, value: float) -> bool:
        if self.comparison == "<=":
            return value <= self.threshold
        if self.comparison == ">=":
            return value >= self.threshold
        if self.comparison == "<":
            return value < self.threshold
        return value > self.threshold


FLOOR_BOUND = 1.2  # issue #17: a goal out of reach leaves its figure within 1.2x of the floor


@dataclass(frozen=True)
class Floor:
    """The best this machine does at a figure's work, measured in the same run.

    A goal can be out of reach on a machine whatever the code does (two fsyncs cost
    what they cost); the floor is the least that work can cost here, so a reader sees
    whether the goal is reachable at all and how far the figure sits from what is.
    ``value`` is the floor on the goal's own scale (the floor arm against the figure's
    baseline); ``ratio`` is the figure's subject against the floor arm itself, the
    median over repetition pairs: a cost ratio (> 1: slower than the floor) unless
    ``higher_is_better``, then a rate ratio (< 1: slower than the floor).
    """

    name: str
    what: str
    value: float
    ratio: float
    ratio_means: str
    higher_is_better: bool = False
    spread: tuple[float, float] | None = None
    note: str | None = None
    bound: float = FLOOR_BOUND

    @property
    def within(self) -> bool:
        """The figure sits within ``bound`` times of the floor (faster than it counts too)."""
        if self.higher_is_better:
            return self.ratio * self.bound >= 1.0
        return self.ratio <= self.bound

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "what": self.what,
            "value": round(self.value, 4),
            "ratio": round(self.ratio, 4),
            "ratio_means": self.ratio_means,
            "higher_is_better": self.higher_is_better,
            "spread": None if self.spread is None else [round(v, 4) for v in self.spread],
            "bound": self.bound,
            "within": self.within,
            "note": self.note,
        }


@dataclass
class Figure:
    """One reported number: subject against baseline, the ratio, and the goal if any.

    ``value`` is what the goal judges; it is the ratio unless the goal is stated on
    another quantity (an overhead share, an absolute size). ``None`` means not measured.
    ``floor``, when set, is the least the work costs on this machine (:class:`Floor`).
    """

    name: str
    what: str
    subject_label: str
    baseline_label: str
    unit: str
    subject: dict[str, float] | None
    baseline: dict[str, float] | None
    ratio: float | None
    ratio_means: str
    spread: tuple[float, float] | None = None
    goal: Goal | None = None
    value: float | None = None
    value_means: str | None = None
    note: str | None = None
    floor: Floor | None = None

    @property
    def judged(self) -> float | None:
        return self.value if self.value is not None else self.ratio

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.judged is None:
            return None
        return self.goal.holds(self.judged)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "what": self.what,
            "subject_label": self.subject_label,
            "baseline_label": self.baseline_label,
            "unit": self.unit,
            "subject": self.subject,
            "baseline": self.baseline,
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "ratio_means": self.ratio_means,
            "spread": None if self.spread is None else [round(v, 4) for v in self.spread],
            "goal": None
            if self.goal is None
            else {
                "comparison": self.goal.comparison,
                "threshold": self.goal.threshold,
                "text": self.goal.text,
            },
            "value": None if self.judged is None else round(self.judged, 4),
            "value_means": self.value_means or self.ratio_means,
            "met": self.met,
            "note": self.note,
            "floor": None if self.floor is None else self.floor.to_json(),
        }


def floor_figure(
    name: str,
    what: str,
    labels: tuple[str, str],
    unit: str,
    sides: tuple[dict[str, float], dict[str, float]],
    ratio: tuple[float, float, float],
    ratio_means: str,
    note: str | None = None,
) -> Figure:
    """A floor shown as a figure of its own (no goal): its arm against a baseline's,
    ``labels`` and ``sides`` (summaries) in that order, ``ratio`` as :func:`paired` gives it."""
    (subject_label, baseline_label), (subject, baseline) = labels, sides
    return Figure(
        name,
        what,
        subject_label,
        baseline_label,
        unit,
        subject,
        baseline,
        ratio[0],
        ratio_means,
        spread=ratio[1:],
        note=note,
    )


def not_measured(name: str, what: str, why: str, goal: Goal | None = None) -> Figure:
    return Figure(
        name=name,
        what=what,
        subject_label="-",
        baseline_label="-",
        unit="-",
        subject=None,
        baseline=None,
        ratio=None,
        ratio_means="-",
        goal=goal,
        note=f"not measured: {why}",
    )


@dataclass
class BenchResult:
    name: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "figures": [f.to_json() for f in self.figures],
            "notes": self.notes,
            "error": self.error,
            "duration_s": round(self.duration_s, 2),
        }
