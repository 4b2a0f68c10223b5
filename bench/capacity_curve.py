"""A capacity curve: its points, its knee, why it stops growing there, and its plot.

A point is one arm at one level (C agents, S slots): ``summarize``'s keys, the server's
CPU per operation and the cores each process kept busy (``bench.capacity``). The rules
are pure functions over those numbers: the knee is the smallest level whose doubling
gains less than ``MIN_GAIN``; the "why" names the process that held the rate there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.stats import Figure

MIN_GAIN = 0.10  # a doubling that adds less than this is past the knee
CPU_BOUND = 0.85  # cores: a Python process this busy has little idle GIL left to give

Side = dict[str, float]  # one arm at one level


# -- the knee, and why -----------------------------------------------------------------


def find_knee(points: Sequence[tuple[int, float]], min_gain: float = MIN_GAIN) -> int | None:
    """The smallest level whose doubling gains less than ``min_gain``; None if none does."""
    for (level, rate), (_, doubled) in itertools.pairwise(points):
        if doubled < rate * (1 + min_gain):
            return level
    return None


def busy(side: Side, ncpu: int, server: str, client: str) -> str:
    """The cores the server and the client side kept busy at one level, and the rest."""
    s, c, h = side["server_cores"], side[f"{client}_cores"], side["host_cores"]
    rest = max(0.0, h - s - c)  # Redis, git, the kernel's threads, other users' processes
    return f"{server} {s:.2f}, {client} {c:.2f}, the rest {rest:.2f} of the {ncpu} cores"


def why(side: Side, ncpu: int, server: str, client: str) -> str:
    """What held the rate at a level that did not grow, from the cores busy there."""
    s, c, h = side["server_cores"], side[f"{client}_cores"], side["host_cores"]
    cores = busy(side, ncpu, server, client)
    if s >= CPU_BOUND and c >= CPU_BOUND:
        return f"both sides are CPU-bound ({cores}): each Python process holds about one core"
    if s >= CPU_BOUND:
        cost = side["server_cpu_ms_per_op"]
        return (f"the {server} is CPU-bound ({cores}; {cost:.2f} ms of its CPU per operation): "
                "one Python process, one GIL, one core")  # fmt: skip
    if c >= CPU_BOUND:
        return f"the {client} is CPU-bound, not the {server} ({cores})"
    if h >= CPU_BOUND * ncpu and h - s - c >= s + c:
        return f"the host's cores are busy, most of them with other processes ({cores})"
    if h >= CPU_BOUND * ncpu:
        return f"the host's cores are all busy ({cores}): the processes compete for CPU"
    return f"no process is CPU-bound ({cores}): the work waits (fsync, a serial path)"


@dataclass
class Curve:
    """Each arm's points, level by level, and what the knee figure said of them."""

    unit: str
    axis: str  # the level's letter: C agents, S slots
    series: dict[str, list[tuple[int, Side]]] = field(default_factory=dict)
    knees: dict[str, int | None] = field(default_factory=dict)

    def add(self, arm: str, level: int, side: Side) -> None:
        self.series.setdefault(arm, []).append((level, side))

    def knee_figure(
        self, name: str, ncpu: int, client: str, servers: dict[str, str] | None = None
    ) -> Figure:
        """The knee of each arm, the first level that did not grow, and why it did not.

        The first arm is the subject, the second (if any) its baseline; an arm is named
        after its server unless ``servers`` names that server.
        """
        rows: dict[str, Side] = {}
        said = []
        for arm, points in self.series.items():
            levels = [level for level, _ in points]
            knee = self.knees[arm] = find_knee([(lv, s["ops_per_s"]) for lv, s in points])
            read_at = levels[-1] if knee is None else levels[levels.index(knee) + 1]
            at, level = dict(points)[read_at], f"{self.axis}={read_at}"
            rows[arm] = {**({} if knee is None else {"knee": float(knee)}),
                         "why_at": float(read_at),
                         "peak_ops_per_s": max(s["ops_per_s"] for _, s in points),
                         **{k: v for k, v in at.items() if "cores" in k or "cpu" in k}}  # fmt: skip
            server = (servers or {}).get(arm, arm)
            if knee is None:
                cores = busy(at, ncpu, server, client)
                said.append(f"{arm}: knee not reached up to {level} ({cores} there)")
            else:
                said.append(f"{arm}: knee {knee}; at {level} {why(at, ncpu, server, client)}")
        first, *rest = list(self.series)
        base, knee = (rows[rest[0]] if rest else None), self.knees[first]
        if base is not None:
            peak = rows[first]["peak_ops_per_s"] / base["peak_ops_per_s"]
            said.insert(0, f"{first}'s peak {self.unit} = {peak:.3g}x the {rest[0]}'s peak")
        # No ratio: a figure without one is judged on its value alone, so the JSON value
        # is the knee, or None when the curve has none (Figure.judged falls back to ratio).
        return Figure(
            name=name,
            what=f"where {self.unit} stops growing (less than {MIN_GAIN:.0%} more when "
            f"{self.axis} doubles), and why; the cores are read at 'why_at': the first level "
            "that did not grow (the last level if every doubling grew)",
            subject_label=first, baseline_label=rest[0] if rest else "-", unit=self.unit,
            subject=rows[first], baseline=base, ratio=None, ratio_means="-",
            value=None if knee is None else float(knee),
            value_means=f"the knee of the {first} curve ({self.axis})", note="; ".join(said),
        )  # fmt: skip


def write_plot(calls: Curve, jobs: Curve, path: Path) -> str:
    """Both curves as one PNG of three panels, the knees marked; what became of it."""
    try:
        import matplotlib
    except ImportError:
        return f"bench/{path.name} not written: matplotlib is missing (the plot extra)"
    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, (rate, tail, done) = plt.subplots(3, 1, figsize=(7, 10))
    for arm, points in calls.series.items():
        levels = [level for level, _ in points]
        (line,) = rate.plot(levels, [s["ops_per_s"] for _, s in points], "o-", label=arm)
        color = line.get_color()  # an arm keeps its colour in the latency panel
        tail.plot(levels, [s["p99_ms"] for _, s in points], "o-", color=color, label=f"{arm} p99")
        tail.plot(levels, [s["p50_ms"] for _, s in points], "s--", color=color, label=f"{arm} p50")
    rate.set_ylabel("write_file calls / s")
    tail.set_ylabel("ms per call")
    tail.set_yscale("log")
    slots, sides = [p[0] for p in jobs.series["pool"]], [p[1] for p in jobs.series["pool"]]
    done.plot(slots, [s["ops_per_s"] for s in sides], "o-", label="jobs / s")
    done.set_ylabel("jobs / s")
    median = done.twinx()
    median.plot(slots, [s["p50_ms"] / 1e3 for s in sides], "s--", color="gray",
                label="median job s")  # fmt: skip
    median.set_ylabel("median job time, s")
    median.legend(fontsize="small", loc="lower right")
    for axis, curve, xlabel in ((rate, calls, "C"), (tail, calls, "C"), (done, jobs, "S")):
        knee = next(iter(curve.knees.values()), None)
        if knee is not None:
            axis.axvline(knee, color="red", linestyle=":", label=f"knee ({xlabel}={knee})")
        ticks = [level for level, _ in next(iter(curve.series.values()))]
        axis.set_xscale("log", base=2)
        axis.set_xticks(ticks, labels=[str(t) for t in ticks])
        axis.set_xlabel("agents at once (C)" if xlabel == "C" else "slots = worker concurrency (S)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small", loc="upper left")
    rate.set_title("capacity of one host (python -m bench.run --only capacity)")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        return f"bench/{path.name} not written: {exc.strerror or exc}"
    finally:
        plt.close(fig)
    return f"bench/{path.name} (calls/s, p50/p99 per call, jobs/s and median job time)"
