"""What the history benchmark's sessions say: its figures, its table, its plot.

A session is one tool server's life on one slot (``bench.history.session``); a point is
one size of the old slot's history with the sessions of both slots measured there. The
figures judge the largest size; the table and the plot show every size.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.history_slot import Disk
from bench.stats import Figure, Goal, Run, percentile, summarize

GOAL = Goal("<=", 1.2, "<= 1.2x a fresh slot")
ARMS = ("history", "fresh")


@dataclass(frozen=True)
class Session:
    """One tool server's life on one slot: its start, memory, calls and lookups."""

    start_s: float
    start_cpu_s: float  # the server's own CPU seconds by then (less noisy on a busy host)
    rss_start_mb: float
    rss_mb: float  # after the calls and lookups
    calls: Run
    lookup: Run  # a key of the session's own generation
    lookup_old: Run  # the slot's oldest key
    old_answered: int  # timed lookups of the oldest key answered 200 with its receipt


@dataclass(frozen=True)
class Point:
    """One size: the old slot's and the fresh slot's sessions, and what each keeps."""

    size: int  # the records asked for
    records: int  # the old slot's records when its first session began (>= size)
    generations: int  # its leases by then
    built: int  # generations built to reach this size from the size before
    build_s: float
    sessions: dict[str, list[Session]]  # by arm: "history" (the old slot), "fresh"
    disk: dict[str, Disk]  # by arm, after the sessions


def p50_ms(run: Run) -> float:
    return percentile(run.op_s, 50) * 1e3


# The goal's measures: what each is, and the one number a session gives of it.
MEASURES: dict[str, tuple[str, Callable[[Session], float]]] = {
    "start_s": ("tool server start until /healthz answers, s", lambda s: s.start_s),
    "rss_mb": ("tool server VmHWM after start, calls and lookups, MB", lambda s: s.rss_mb),
    "call_ms": ("write_file through ToolClient, p50 per call", lambda s: p50_ms(s.calls)),
    "lookup_ms": ("GET /v1/receipts of this generation's key, p50", lambda s: p50_ms(s.lookup)),
    "lookup_old_ms": (
        "GET /v1/receipts of the slot's oldest key (generation 1), p50",
        lambda s: p50_ms(s.lookup_old),
    ),
}


def ratios(point: Point, measure: str) -> tuple[float, float, float]:
    """(median, min, max) over repetitions of old slot / fresh slot."""
    of = MEASURES[measure][1]
    pairs = zip(point.sessions["history"], point.sessions["fresh"], strict=True)
    values = [of(old) / of(fresh) for old, fresh in pairs]
    return statistics.median(values), min(values), max(values)


def side(point: Point, arm: str, measure: str) -> dict[str, float]:
    """One arm's columns of a figure: medians over sessions, or pooled percentiles."""
    sessions = point.sessions[arm]
    if measure == "start_s":
        starts = [s.start_s for s in sessions]
        found = {"median_s": statistics.median(starts), "min_s": min(starts), "max_s": max(starts),
                 "cpu_s": statistics.median(s.start_cpu_s for s in sessions)}  # fmt: skip
    elif measure == "rss_mb":
        found = {
            "after_start_mb": statistics.median(s.rss_start_mb for s in sessions),
            "after_calls_mb": statistics.median(s.rss_mb for s in sessions),
        }
    else:
        runs = {"call_ms": "calls", "lookup_ms": "lookup", "lookup_old_ms": "lookup_old"}
        found = summarize([getattr(s, runs[measure]) for s in sessions])
        if measure == "lookup_old_ms":
            found["answered_200"] = sum(s.old_answered for s in sessions)
    return {k: round(v, 4) for k, v in found.items()}


def figures(point: Point) -> list[Figure]:
    """The largest size against its fresh slot: a figure per measure, and the hot file."""
    subject_label = f"slot with {point.records:,} records ({point.generations:,} generations)"
    baseline_label = "fresh slot (no history but this run's own sessions on it)"
    found = []
    for name, (what, _) in MEASURES.items():
        ratio, low, high = ratios(point, name)
        found.append(
            Figure(
                name=f"history.{name}",
                what=what,
                subject_label=subject_label,
                baseline_label=baseline_label,
                unit="calls/s" if name.endswith("_ms") else name.rsplit("_", 1)[1],
                subject=side(point, "history", name),
                baseline=side(point, "fresh", name),
                ratio=ratio,
                ratio_means="old slot / fresh slot, median over repetitions",
                spread=(low, high),
                goal=GOAL,
            )
        )
    mb = {arm: (point.disk[arm].hot_bytes / 1e6, point.disk[arm].kept_bytes / 1e6) for arm in ARMS}
    found.append(
        Figure(
            name="history.hot_file_mb",
            what="the slot's hot receipt file, and all it keeps outside its tree, MB",
            subject_label=subject_label,
            baseline_label=baseline_label,
            unit="MB",
            subject={"hot_mb": round(mb["history"][0], 3), "kept_mb": round(mb["history"][1], 3)},
            baseline={"hot_mb": round(mb["fresh"][0], 3), "kept_mb": round(mb["fresh"][1], 3)},
            ratio=mb["history"][0] / mb["fresh"][0] if mb["fresh"][0] else None,
            ratio_means="old slot's hot file / fresh slot's hot file (no goal)",
        )
    )
    return found


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _row(point: Point, arm: str) -> list[str]:
    sessions, disk = point.sessions[arm], point.disk[arm]
    calls = summarize([s.calls for s in sessions])
    cells = [_fmt(statistics.median(MEASURES[m][1](s) for s in sessions)) for m in MEASURES]
    if arm == "history":
        cells = [f"{c} ({ratios(point, m)[0]:.2f}x)" for c, m in zip(cells, MEASURES, strict=True)]
    start, rss, call, lookup, old = cells
    rss_start = statistics.median(s.rss_start_mb for s in sessions)
    cpu = statistics.median(s.start_cpu_s for s in sessions)
    return [start, _fmt(cpu), _fmt(rss_start), rss, call, _fmt(calls["p99_ms"]),
            lookup, old, _fmt(disk.hot_bytes / 1e6), _fmt(disk.kept_bytes / 1e6)]  # fmt: skip


def table(points: Sequence[Point]) -> str:
    """Every size: both slots' medians over sessions, the old slot's ratios in brackets."""
    rows = [
        "Every size (medians over sessions; in brackets the old slot over the fresh one, "
        "median over repetitions, as the figures; start CPU s is the server's own CPU "
        "time until it answered; p99 pooled over sessions; records and generations as the "
        "first session on the old slot began; the build's ms per generation is one lease, "
        "100 records with no fsync, one release):",
        "",
        "| size | slot | start s | start CPU s | RSS after start MB | RSS after calls MB "
        "| call p50 ms | call p99 ms | lookup p50 ms | oldest key lookup p50 ms "
        "| hot file MB | kept MB | build ms / generation |",
        "|---:|---|" + "---:|" * 11,
    ]
    for point in points:
        per_generation = point.build_s / point.built * 1e3 if point.built else 0.0
        old = f"old: {point.records:,} records, {point.generations:,} generations"
        for arm in ARMS:
            label, build = (old, f"{per_generation:.3g}") if arm == "history" else ("fresh", "-")
            cells = " | ".join([*_row(point, arm), build])
            rows.append(f"| {point.size:,} | {label} | {cells} |")
    return "\n".join(rows)


def plot(points: Sequence[Point], path: Path) -> str:
    """Each measure against records (log x), both slots, and the ratios; what became of it."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"bench/{path.name} not written: matplotlib is missing (the plot extra)"
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    records = [p.records for p in points]
    fig, axes = plt.subplots(3, 2, figsize=(10, 11), layout="constrained")
    panels = [("start_s", "start until /healthz, s"), ("rss_mb", "VmHWM after calls, MB"),
              ("call_ms", "write_file p50, ms"), ("lookup_ms", "receipt lookup p50, ms"),
              ("lookup_old_ms", "oldest key lookup p50, ms")]  # fmt: skip
    for axis, (measure, label) in zip(axes.flat, panels, strict=False):
        of = MEASURES[measure][1]
        top = 0.0
        for arm, style in (("history", "o-"), ("fresh", "s--")):
            values = [statistics.median(of(s) for s in p.sessions[arm]) for p in points]
            axis.plot(records, values, style, label="old slot" if arm == "history" else "fresh")
            top = max(top, *values)
        axis.set_ylabel(label)
        axis.set_ylim(0, top * 1.15)  # from zero: a flat line reads as flat
    disk = axes.flat[5]
    disk.plot(records, [p.disk["history"].hot_bytes / 1e6 for p in points], "o-", label="hot file")
    disk.plot(records, [p.disk["history"].kept_bytes / 1e6 for p in points], "s-", label="all kept")
    disk.plot(records, [p.disk["fresh"].hot_bytes / 1e6 for p in points], "o--", label="fresh: hot")
    disk.set_ylabel("on disk, MB")
    disk.set_yscale("log")
    for axis in axes.flat:
        axis.set(xscale="log", xlabel="receipt records in the old slot")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    fig.suptitle("a slot's history against a fresh slot (python -m bench.run --only history)")
    try:
        fig.savefig(path, format="png", dpi=100)
        return f"bench/{path.name} (each measure against records, old slot and fresh; disk)"
    except OSError as exc:
        return f"bench/{path.name} not written: {exc.strerror or exc}"
    finally:
        plt.close(fig)
