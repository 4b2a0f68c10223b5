"""Peak memory of the long-running processes, observed during the runs above.

- the tool server: ``VmHWM`` after the pipeline benchmark's calls and after the e2e
  jobs (apply_patch, git, sandboxed run_tests), next to the no-op FastAPI server of
  the pipeline baseline (the same web stack doing nothing);
- the Celery worker: the sum of ``VmHWM`` over the parent and its prefork children
  after the e2e jobs, next to as many no-op servers (a plain Python web process each);
- the detector: ``ru_maxrss`` over the large log (goal < 100 MB, judged in
  ``detector.peak_rss``), next to a bare Python loop over the same file's lines.

Naming ``memory`` in ``--only`` runs ``pipeline``, ``e2e`` and ``detector`` too.
"""

from __future__ import annotations

from bench.fixtures import Context
from bench.stats import BenchResult, Figure, not_measured


def _figure(
    ctx: Context, name: str, what: str, key: str, base_key: str, base_times: float = 1.0
) -> Figure:
    seen, base = ctx.memory.get(key), ctx.memory.get(base_key)
    if seen is None or base is None:
        missing = key if seen is None else base_key
        return not_measured(name, what, f"no observation {missing!r} in this run")
    return Figure(
        name=name,
        what=what,
        subject_label=seen[1],
        baseline_label=base[1] + (f" x {base_times:g}" if base_times != 1 else ""),
        unit="-",
        subject={"peak_rss_mb": seen[0]},
        baseline={"peak_rss_mb": round(base[0] * base_times, 2)},
        ratio=seen[0] / (base[0] * base_times),
        ratio_means="peak RSS / baseline peak RSS (no goal: reported)",
    )


def run(ctx: Context) -> BenchResult:
    result = BenchResult("memory")
    processes = ctx.memory.get("worker.e2e.processes", (1.0, ""))[0]
    result.figures += [
        _figure(ctx, "memory.toolserver.pipeline", "tool server, pipeline run",
                "toolserver.pipeline", "noop_server"),
        _figure(ctx, "memory.toolserver.e2e", "tool server, e2e run",
                "toolserver.e2e", "noop_server"),
        _figure(ctx, "memory.worker.e2e", "Celery worker (parent + children), e2e run",
                "worker.e2e", "noop_server", processes),
        _figure(ctx, "memory.detector", "ops detect over the detector benchmark's large log",
                "detector", "python_line_loop"),
    ]  # fmt: skip
    if "detector" in ctx.memory:
        result.notes.append(
            f"detector: {ctx.memory['detector'][0]} MB; its goal (< 100 MB) is judged in "
            "detector.peak_rss."
        )
    return result
