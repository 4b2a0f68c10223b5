"""What containing one ``run_tests`` costs at start-up: bubblewrap against a bare spawn.

Subject: ``tools.sandbox.run.run(["/bin/true"], work, mode="required")`` (the limits
shim, a pids cgroup when one is writable, bubblewrap with its namespaces and bind
mounts). Baseline: ``subprocess.run(["/bin/true"])``. A third arm,
``mode="off"``, splits the cost: everything but bubblewrap (shim, cgroup, output
pumping). The bwrap self-test runs once per process and is warmed up first, as in
a long-running tool server.

No goal: reported as a figure. A fourth figure, ``sandbox.exec_start``, is the whole
``exec`` tool call against a bare bubblewrap run (``bench/exec_start.py``; goal: at
most 1.5x), with its two floors as figures of their own.
"""

from __future__ import annotations

import subprocess

from bench import exec_start
from bench.fixtures import Context
from bench.stats import (
    BenchResult,
    Figure,
    cost_ratio,
    interleave,
    not_measured,
    summarize,
    timed,
)
from tools.sandbox import run as sandbox


def run(ctx: Context) -> BenchResult:
    result = BenchResult("sandbox")
    reps, n = ctx.pick(3, 5), ctx.pick(10, 40)
    work = ctx.dir("sandbox") / "work"
    work.mkdir()
    try:
        warm = sandbox.run(["/bin/true"], work, mode="required")
    except sandbox.SandboxUnavailable as exc:
        result.figures.append(
            not_measured("sandbox.start", "bwrap start-up per run_tests", exc.message)
        )
        return result
    if warm.exit_code != 0:
        result.error = f"/bin/true under bwrap exited {warm.exit_code}: {warm.stderr[-300:]}"
        return result

    def bwrap_op(_: int) -> None:
        if sandbox.run(["/bin/true"], work, mode="required").exit_code != 0:
            raise RuntimeError("/bin/true failed under bwrap")

    def off_op(_: int) -> None:
        if sandbox.run(["/bin/true"], work, mode="off").exit_code != 0:
            raise RuntimeError("/bin/true failed with the sandbox off")

    def bare_op(_: int) -> None:
        subprocess.run(["/bin/true"], check=True)

    timed(3, off_op)
    timed(3, bare_op)
    runs = interleave(
        reps,
        {
            "bwrap": lambda _: timed(n, bwrap_op),
            "off": lambda _: timed(n, off_op),
            "bare": lambda _: timed(n, bare_op),
        },
    )
    for name, label, subject in (
        ("sandbox.start", "sandbox.run(mode='required'): shim + cgroup + bwrap", "bwrap"),
        ("sandbox.start_without_bwrap", "sandbox.run(mode='off'): shim + cgroup only", "off"),
    ):
        ratio, low, high = cost_ratio(runs[subject], runs["bare"])
        result.figures.append(
            Figure(
                name=name,
                what="start-up cost of one /bin/true run",
                subject_label=label,
                baseline_label="subprocess.run(['/bin/true'])",
                unit="runs/s",
                subject=summarize(runs[subject]),
                baseline=summarize(runs["bare"]),
                ratio=ratio,
                ratio_means="subject time per run / bare spawn time per run (no goal)",
                spread=(low, high),
            )
        )
    result.notes.append(
        f"{reps} repetitions of {n} runs per arm, interleaved; mode used: {warm.mode}; "
        f"warning: {warm.warning or 'none'}."
    )
    exec_figures, notes = exec_start.figure(ctx, reps, ctx.pick(10, 100))
    result.figures += exec_figures
    result.notes += notes  # the last is a table, which ends the list of notes
    return result
