"""The benchmark suite's one entry point.

    python -m bench.run [--quick] [--only NAME,...] [--json-out PATH] [--md-out PATH]

Runs the named benchmarks (all by default, in a fixed order), prints progress on
stderr, writes the figures as JSON (``--json-out``) and as Markdown. A full run (no
``--quick``, no ``--only``) writes ``bench/RESULTS.md``; a quick or partial run writes
``bench/out/RESULTS.partial.md`` instead unless ``--md-out`` says otherwise, so a smoke
test never overwrites the recorded full run. Exit 0 when every benchmark measured
(goals met or not), 1 when one failed to run, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import (
    capacity,
    detector,
    e2e,
    envs,
    follow_history,
    gateway,
    history,
    mcp_call,
    memory,
    pipeline,
    receipts,
    recycle,
    sandbox_start,
)
from bench.fixtures import REPO_ROOT, Context
from bench.machine import cpu_after_sync, cpu_ticks, describe, steal_share
from bench.report import render
from bench.stats import BenchError, BenchResult
from runner.redis_server import EmbeddedRedis

BENCHMARKS: dict[str, Callable[[Context], BenchResult]] = {
    "pipeline": pipeline.run,
    "mcp": mcp_call.run,
    "gateway": gateway.run,
    "recycle": recycle.run,
    "receipts": receipts.run,
    "detector": detector.run,
    "e2e": e2e.run,
    "envs": envs.run,
    "sandbox": sandbox_start.run,
    "capacity": capacity.run,
    "history": history.run,
    "follow": follow_history.run,
    "memory": memory.run,  # last: it reports what the others observed
}
# memory reports peaks observed during these runs; naming it alone runs them too.
REQUIRES = {"memory": ("pipeline", "e2e", "detector")}
RESULTS_MD = REPO_ROOT / "bench" / "RESULTS.md"
PARTIAL_MD = REPO_ROOT / "bench" / "out" / "RESULTS.partial.md"


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_only(text: str | None) -> list[str]:
    """The benchmarks to run, in suite order; unknown names are a usage error."""
    if not text:
        return list(BENCHMARKS)
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in BENCHMARKS]
    if unknown or not wanted:
        raise ValueError(
            f"unknown benchmark(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(BENCHMARKS)}"
        )
    for name in list(wanted):
        wanted.extend(REQUIRES.get(name, ()))
    return [name for name in BENCHMARKS if name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, small inputs")
    parser.add_argument("--only", metavar="NAME,...", help=f"some of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--json-out", type=Path, metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--md-out", type=Path, metavar="PATH", help="where to write the Markdown")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    try:
        names = parse_only(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    command = "python -m bench.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    full = not args.quick and args.only is None
    md_out: Path = args.md_out or (RESULTS_MD if full else PARTIAL_MD)

    scratch = Path(tempfile.mkdtemp(prefix="slotrunner-bench-"))
    machine = describe()
    machine["cpu_after_sync"] = cpu_after_sync(scratch)
    _log(f"running {', '.join(names)} ({'quick' if args.quick else 'full'}) in {scratch}")
    redis_server = EmbeddedRedis(scratch / "redis-home")
    results: list[BenchResult] = []
    started = time.monotonic()
    try:
        ctx = Context(args.quick, scratch, redis_server.ensure(), _log)
        for name in names:
            _log(f"{name}: start")
            t0 = time.monotonic()
            try:
                result = BENCHMARKS[name](ctx)
            except BenchError as exc:
                result = BenchResult(name, error=str(exc))
            except Exception as exc:  # one broken benchmark must not hide the others
                result = BenchResult(name, error=f"{type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
            result.duration_s = time.monotonic() - t0
            results.append(result)
            _log(f"{name}: done in {result.duration_s:.1f}s" + _brief(result))
    finally:
        redis_server.leave()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["cpu_steal_share"] = steal_share(machine.pop("cpu_ticks_at_start", None), cpu_ticks())
    document = {
        "command": command,
        "quick": args.quick,
        "benchmarks_run": names,
        "machine": machine,
        "total_s": round(time.monotonic() - started, 1),
        "results": {r.name: {**r.to_json(), "about": _about(r.name)} for r in results},
    }
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(document, indent=1) + "\n")
        _log(f"wrote {args.json_out}")
    md_out.parent.mkdir(parents=True, exist_ok=True)
    md_out.write_text(render(document))
    _log(f"wrote {md_out}")
    return 1 if any(r.error for r in results) else 0


def _about(name: str) -> str:
    """The benchmark's module docstring: what it measures and its goal."""
    return sys.modules[BENCHMARKS[name].__module__].__doc__ or ""


def _brief(result: BenchResult) -> str:
    if result.error:
        return f" -- ERROR: {result.error}"
    parts = []
    for fig in result.figures:
        if fig.ratio is not None:
            verdict = "" if fig.met is None else (" met" if fig.met else " NOT met")
            parts.append(f"{fig.name}={fig.judged:.3g}{verdict}")
    return (" -- " + ", ".join(parts)) if parts else ""


if __name__ == "__main__":
    raise SystemExit(main())
