"""``slotrunner ops detect`` throughput against the jq|awk alert, and its memory.

The alert is the one-line check of docs/architecture.md §Log records.

The log is made by the generator the detector's own tests use
(``ops.testing.synthlog.synth_log``: the log schema of ``runner.core.events``, two
hosts, incidents of every kind injected, no garbage lines: jq stops at the first line
it cannot parse). Subject: ``python -m ops.cli detect PATH --json`` (a child process, output
discarded). Baseline, on the same file in the same run::

    jq -r 'select(.tool=="apply_patch") | [.job_id,.slot_generation,.receipt_job] | @tsv' FILE \\
      | awk -F'\\t' '$1 != $3 { print }'

Memory: the detector's peak RSS (``ru_maxrss`` from ``wait4``) on a large log (about
1 GB in the full run, the throughput file with ``--quick``), next to a bare Python
loop over the same file's lines (the floor of any streaming reader).

Exactness at scale (``detector.exact``): 1,000,000 lines (100,000 with ``--quick``)
with every incident variant for every mutating tool twice, the first and the last
line among them, and torn and binary garbage lines; the detector's ``--json`` output
must name exactly the injected incidents and malformed lines, or the benchmark fails.
This was a 30 s test of the suite; the suite keeps the same assertions on a small log
(``tests/ops/detect/test_detect.py``), the size and the time are measured here.

Decode floor (``detector.decode_floor``), interleaved with both arms: ``python -m
bench.decode_floor PATH``, a child process that reads the same file with the detector's
own reader and structs (``ops.detect.inputs.read_batches``) and drops every record. The
throughput figure is set against it: the speed this reader allows on this machine.

Goals: at least 10x the jq pipeline's throughput; peak RSS under 100 MB.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.fixtures import REPO_ROOT, Context
from bench.machine import run_peak_rss
from bench.stats import (
    BenchError,
    BenchResult,
    Figure,
    Floor,
    Goal,
    Run,
    floor_figure,
    interleave,
    not_measured,
    rate_ratio,
    summarize,
)
from ops.detect.detector import DETECT_KINDS, Kind
from ops.testing.synthlog import MUTATING, LogSynth, synth_log

SPEED_GOAL = Goal(">=", 10.0, ">= 10x the jq|awk alert's pipeline")
RSS_GOAL = Goal("<", 100.0, "< 100 MB peak RSS on a large log")
SEED_PIPELINE = (
    'jq -r \'select(.tool=="apply_patch") | [.job_id,.slot_generation,.receipt_job] '
    "| @tsv' \"$0\" | awk -F'\\t' '$1 != $3 { print }'"
)
BYTES_PER_LINE = 293  # what synth_log writes on average (measured once; only sizes the file)
DETECT_OK = (0, 1)  # clean, or incidents found (the generated log has some)


def _generate(path: Path, lines: int, seed: int) -> None:
    rounds = max(1, lines // 200_000)
    synth_log(path, lines, seed=seed, rounds=rounds, garbage=False)


def _run(argv: list[str], ok: tuple[int, ...]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, cwd=REPO_ROOT
    )
    wall = time.perf_counter() - start
    if proc.returncode not in ok:
        raise BenchError(f"{argv[:4]} exited {proc.returncode}: {proc.stderr[-300:]!r}")
    return wall


def run(ctx: Context) -> BenchResult:
    result = BenchResult("detector")
    reps = ctx.pick(3, 5)
    lines = ctx.pick(60_000, 600_000)
    work = ctx.dir("detector")
    log = work / "events.jsonl"
    ctx.log(f"detector: generating {lines:,} log lines")
    _generate(log, lines, seed=11)
    size_mb = log.stat().st_size / 1e6
    detect = [sys.executable, "-m", "ops.cli", "detect", str(log), "--json"]
    seed = ["bash", "-o", "pipefail", "-c", SEED_PIPELINE, str(log)]
    decode = [sys.executable, "-m", "bench.decode_floor", str(log)]  # found: _run runs in the repo
    empty = work / "empty.jsonl"
    empty.touch()
    startup = [sys.executable, "-m", "ops.cli", "detect", str(empty), "--json"]

    def arm(argv: list[str], ok: tuple[int, ...]) -> Run:
        wall = _run(argv, ok)
        return Run((wall,), wall, lines)  # one op = one whole-file scan; rate = lines/s

    if shutil.which("jq") is None:
        result.figures.append(
            not_measured(
                "detector.throughput",
                "detector vs the jq|awk alert's pipeline",
                "jq is not installed (apt-get install jq)",
                SPEED_GOAL,
            )
        )
        runs = interleave(reps, {"subject": lambda _: arm(detect, DETECT_OK)})
    else:
        _run(detect, DETECT_OK)  # warm the page cache and the interpreter's imports
        _run(seed, (0,))
        _run(decode, (0,))
        runs = interleave(
            reps,
            {
                "subject": lambda _: arm(detect, DETECT_OK),
                "baseline": lambda _: arm(seed, (0,)),
                "floor": lambda _: arm(decode, (0,)),
                "startup": lambda _: arm(startup, (0,)),
            },
        )
        speed = [
            b.wall_s / s.wall_s for s, b in zip(runs["subject"], runs["baseline"], strict=True)
        ]
        speed.sort()
        result.figures.append(
            Figure(
                name="detector.throughput",
                what=f"scan a {lines:,}-line ({size_mb:.0f} MB) log",
                subject_label="python -m ops.cli detect PATH --json",
                baseline_label="jq -r 'select(.tool==\"apply_patch\") ...' | awk",
                unit="lines/s",
                subject=_per_file(runs["subject"], size_mb),
                baseline=_per_file(runs["baseline"], size_mb),
                ratio=speed[len(speed) // 2],
                ratio_means="detector lines/s / jq pipeline lines/s",
                spread=(speed[0], speed[-1]),
                goal=SPEED_GOAL,
                note="p50/p99 here are per whole-file run (one op = one scan of the file)",
                floor=_floor(runs),
            )
        )
        result.figures.append(_floor_figure(runs, lines, size_mb))
        result.notes.append(_startup_note(runs))
    result.figures.append(_memory(ctx, work, log, lines))
    result.figures.append(_exact(ctx, work))
    result.notes.append(
        f"{reps} repetitions per arm, interleaved, each a child process over the whole file "
        "(interpreter start and imports included: see the start-up note). Log generated by "
        "ops.testing.synthlog.synth_log."
    )
    return result


def _floor(runs: dict[str, list[Run]]) -> Floor:
    """The detector against the decode floor; the floor's own speed on the goal's scale."""
    ratio, low, high = rate_ratio(runs["subject"], runs["floor"])
    jq = rate_ratio(runs["baseline"], runs["floor"])[0]
    return Floor(
        name="detector.decode_floor",
        what="the detector's reader and structs, every record dropped (bench.decode_floor)",
        value=rate_ratio(runs["floor"], runs["baseline"])[0],
        ratio=ratio,
        ratio_means="detector lines/s / decode floor lines/s",
        higher_is_better=True,
        spread=(low, high),
        note=f"the jq|awk pipeline is at {jq:.3g}x of the decode floor",
    )


def _startup_note(runs: dict[str, list[Run]]) -> str:
    p50 = {arm: summarize(arm_runs)["p50_ms"] for arm, arm_runs in runs.items()}
    start, detect, floor = p50["startup"], p50["subject"], p50["floor"]
    return (
        f"Start-up (interpreter and imports: ops detect of an empty file, interleaved with "
        f"the other arms): p50 {start:,.0f} ms, {100 * start / detect:.0f} % of the "
        f"detector's p50 run ({detect:,.0f} ms) and {100 * start / floor:.0f} % of the decode "
        f"floor's ({floor:,.0f} ms, which imports the same reader and structs)."
    )


def _floor_figure(runs: dict[str, list[Run]], lines: int, size_mb: float) -> Figure:
    return floor_figure(
        "detector.decode_floor",
        f"the decode floor over the same {lines:,}-line log vs the jq|awk alert",
        (
            "python -m bench.decode_floor PATH (read_batches, records dropped)",
            "jq -r 'select(.tool==\"apply_patch\") ...' | awk",
        ),
        "lines/s",
        (_per_file(runs["floor"], size_mb), _per_file(runs["baseline"], size_mb)),
        rate_ratio(runs["floor"], runs["baseline"]),
        "decode floor lines/s / jq pipeline lines/s (no goal: a floor)",
        note="the detector's own ratio to this floor is under detector.throughput",
    )


def _per_file(runs: list[Run], size_mb: float) -> dict[str, float]:
    out = summarize(runs)
    out["mb_per_s"] = round(size_mb * out["ops_per_s"] / runs[0].ops, 2)
    return out


def _memory(ctx: Context, work: Path, small: Path, small_lines: int) -> Figure:
    if ctx.quick:
        big, lines = small, small_lines
    else:
        lines = 1_000_000_000 // BYTES_PER_LINE
        big = work / "big.jsonl"
        ctx.log(f"detector: generating a large log of {lines:,} lines (about 1 GB)")
        _generate(big, lines, seed=12)
    size_mb = big.stat().st_size / 1e6
    code, wall, peak = run_peak_rss(
        [sys.executable, "-m", "ops.cli", "detect", str(big), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if code not in DETECT_OK:
        raise BenchError(f"the detector exited {code} on the large log")
    floor_code, _, floor = run_peak_rss(
        [sys.executable, "-c", "import sys\nfor _ in open(sys.argv[1], 'rb'): pass", str(big)],
    )
    if floor_code != 0:
        raise BenchError("the bare line loop failed on the large log")
    ctx.memory["detector"] = (peak, f"ops detect over {size_mb:,.0f} MB ({lines:,} lines)")
    ctx.memory["python_line_loop"] = (floor, "a bare Python loop over the same file")
    if big != small:
        big.unlink()
    return Figure(
        name="detector.peak_rss",
        what=f"peak RSS over a {size_mb:,.0f} MB log ({lines:,} lines)",
        subject_label="python -m ops.cli detect PATH --json",
        baseline_label="python -c 'for _ in open(PATH, \"rb\"): pass'",
        unit="-",
        subject={
            "peak_rss_mb": peak,
            "wall_s": round(wall, 2),
            "mb_per_s": round(size_mb / wall, 1),
        },
        baseline={"peak_rss_mb": floor},
        ratio=peak / floor,
        ratio_means="detector peak RSS / bare line-loop peak RSS",
        goal=RSS_GOAL,
        value=peak,
        value_means="detector peak RSS in MB",
    )


def _exact(ctx: Context, work: Path) -> Figure:
    """Every injected incident and garbage line found at its line, on a large dirty log."""
    lines = ctx.pick(100_000, 1_000_000)
    path = work / "exact.jsonl"
    ctx.log(f"detector: generating {lines:,} lines with incidents and garbage")
    synth = synth_log(path, lines, rounds=2, seed=1)
    out = work / "exact.out.jsonl"
    with open(out, "wb") as sink:
        code, wall, peak = run_peak_rss(
            [sys.executable, "-m", "ops.cli", "detect", str(path), "--json"],
            stdout=sink,
            stderr=subprocess.DEVNULL,
        )
    if code != 1:  # the log holds incidents: anything but "incidents found" is wrong
        raise BenchError(f"the detector exited {code} on the dirty log")
    _check_exact(synth, path, lines, [json.loads(ln) for ln in out.read_bytes().splitlines()])
    path.unlink()
    out.unlink()
    return Figure(
        name="detector.exact",
        what=f"a {lines:,}-line log with every incident for every mutating tool, and garbage",
        subject_label="python -m ops.cli detect PATH --json",
        baseline_label="-",
        unit="lines/s",
        subject={
            "lines": lines,
            "incidents": len(synth.expected),
            "malformed": len(synth.malformed),
            "wall_s": round(wall, 2),
            "lines_per_s": round(lines / wall),
            "peak_rss_mb": peak,
        },
        baseline=None,
        ratio=None,
        ratio_means="-",
        note="exactly the injected incidents and malformed lines were reported (checked)",
    )


def _check_exact(synth: LogSynth, path: Path, lines: int, objs: list[dict[str, object]]) -> None:
    *items, summary = objs
    where = str(path)
    found = {(o["kind"], o["path"], o["line"]) for o in items if o["kind"] != "malformed"}
    malformed = {(o["path"], o["line"]) for o in items if o["kind"] == "malformed"}
    pairs = {(o["kind"], o["tool"]) for o in items if o["kind"] != "malformed"}
    wrong = [
        what
        for what, ok in [
            ("line count", summary.get("lines") == lines == synth.lines[where]),
            ("incidents", found == synth.expected),
            ("malformed lines", malformed == synth.malformed),
            ("first line", (Kind.UNOWNED, where, 1) in found),
            ("last line", (Kind.CROSS_JOB, where, lines) in found),
            ("kinds x tools", pairs == {(k, t) for k in DETECT_KINDS for t in MUTATING}),
        ]
        if not ok
    ]
    if wrong:
        raise BenchError(f"the detector's report on {where} differs in: {', '.join(wrong)}")
