"""Flat memory of ``ops detect --follow`` as the log it has read grows (#17 item 5).

A follower never ends, and "applied at most once, ever" forgets no key, so what it
keeps per key decides whether its memory grows with the pool's age. Its keys live in
``keys.sqlite`` in its state dir (``ops.detect.keystore``), behind a fixed page cache.

For each size N of history (applied keys; about 900 bytes of log a key, as real
traffic writes, so 10^7 keys is a log of about 9 GB; ``--quick``: 10^3 and 10^5):

1. write a log of N keys (:func:`write_log`: eight slots, each generation a lease, 100
   applies, 150 reads and a release, every key new) and start the real
   ``slotrunner ops detect --follow`` (``python -m ops.cli``) on it with a new state
   dir; time it until its checkpoint has read every line (``catchup``), and take its
   resident high-water mark (``VmHWM``), which a backlog bounds by the read budget of
   a poll, not by the log's size;
2. stop it (SIGTERM) and start it again on the same state dir: the restart, then
   ``LIVE`` more generations appended while it follows, and one apply that repeats the
   log's very first key, which it must report as ``duplicate_apply`` (the benchmark
   fails otherwise: flat memory that forgot a key would be no result). Its ``VmHWM``
   after that is the figure: the memory of a follower with N keys of history.

The baseline is the same restart and live traffic on a history of 10^3 keys, so each
figure is (old follower / fresh follower). ``follow.rss_mb`` is judged at the largest
size (goal <= 1.2x, as item 5 asks of a fresh slot); the notes give each size's table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.fixtures import REPO_ROOT, Context
from bench.machine import vm_hwm_mb
from bench.stats import BenchError, BenchResult, Figure, Goal

SLOTS = 8
APPLIES, READS = 100, 150  # per generation of a slot: about 900 bytes of log a key
LIVE = 20  # generations appended while the restarted follower follows
BASE_KEYS = 1_000


def _lines(gen: int, slot: int) -> bytes:
    job, sid, ts = f"j{gen}-{slot}", f"S{slot}", f"2026-01-01T00:00:{slot:02d}.000000Z"
    head = f'"slot_id": "{sid}", "generation": {gen}, "job_id": "{job}", "attempt": 1'
    out = [f'{{"event": "slot_leased", {head}, "host": "h1", "ts": "{ts}"}}']
    call = (
        f'{{"event": "tool_result", "job_id": "{job}", "attempt": 1, "slot_id": "{sid}", '
        f'"slot_generation": {gen}, "tool": "%s", "idempotency_key": "%s", '
        f'"outcome": "%s", "http_status": 200, "queue_wait_ms": 0.4, "service_ms": 3.1, '
        f'"receipt_job": "{job}", "receipt_generation": {gen}, "host": "h1", "ts": "{ts}"}}'
    )
    for i in range(APPLIES):
        out.append(call % ("write_file", f"{job}:k{i}", "applied"))
        if i % 2:
            out.append(call % ("read_file", f"{job}:r{i}", "read"))
        out.append(call % ("list_dir", f"{job}:l{i}", "read"))
    out.append(f'{{"event": "slot_released", {head}, "host": "h1", "ts": "{ts}"}}')
    return ("\n".join(out) + "\n").encode()


def _generations(first: int, count: int) -> Iterator[bytes]:
    for gen in range(first, first + count):
        yield b"".join(_lines(gen, slot) for slot in range(SLOTS))


def write_log(path: Path, keys: int) -> int:
    """A clean log of about ``keys`` applied keys; its line count."""
    gens = max(1, keys // (SLOTS * APPLIES))
    lines = 0
    with open(path, "wb") as fh:
        for block in _generations(1, gens):
            fh.write(block)
            lines += block.count(b"\n")
    return lines


def _checkpoint_lines(state: Path) -> int:
    try:
        return int(json.loads((state / "checkpoint.json").read_bytes())["lines"])
    except (OSError, ValueError, KeyError):
        return -1


@dataclass
class Follow:
    proc: subprocess.Popen[bytes]
    state: Path

    @classmethod
    def start(cls, log: Path, state: Path) -> Follow:
        argv = [sys.executable, "-m", "ops.cli", "detect", "--follow", "--json"]
        argv += ["--state-dir", str(state), str(log)]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        return cls(proc, state)

    def wait_lines(self, lines: int, timeout_s: float) -> float:
        began = time.perf_counter()
        while _checkpoint_lines(self.state) < lines:
            if self.proc.poll() is not None:
                raise BenchError(f"the follower exited {self.proc.returncode}")
            if time.perf_counter() - began > timeout_s:
                raise BenchError(f"the follower did not read {lines} lines in {timeout_s:.0f} s")
            time.sleep(0.05)
        return time.perf_counter() - began

    def hwm_mb(self) -> float:
        hwm = vm_hwm_mb(self.proc.pid)
        if hwm is None:
            raise BenchError("the follower is gone")
        return hwm

    def stop(self) -> list[dict[str, object]]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        if self.proc.returncode not in (0, 1):
            raise BenchError(f"the follower ended {self.proc.returncode}: {err.decode()[-300:]}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@dataclass
class Point:
    keys: int
    log_mb: float
    catchup_s: float
    catchup_hwm_mb: float
    state_mb: float
    rss_mb: float  # the restarted follower's VmHWM after live traffic


def measure(ctx: Context, keys: int) -> Point:
    where = ctx.dir(f"follow-{keys}")
    log, state = where / "slotrunner.jsonl", where / "state"
    lines = write_log(log, keys)
    log_mb = round(log.stat().st_size / 1e6, 1)
    ctx.log(f"follow: {keys} keys, {log_mb:.0f} MB of log")
    first = Follow.start(log, state)
    try:
        catchup = first.wait_lines(lines, timeout_s=3600)
        catchup_hwm = first.hwm_mb()
    finally:
        first.stop()
    again = Follow.start(log, state)
    try:
        gens = max(1, keys // (SLOTS * APPLIES))
        with open(log, "ab") as fh:
            for block in _generations(gens + 1, LIVE):
                fh.write(block)
                lines += block.count(b"\n")
                fh.flush()
            # The log's very first key, applied again inside a live lease: a duplicate.
            repeat = (
                _lines(gens + LIVE, 0)
                .splitlines()[1]
                .replace(f"j{gens + LIVE}-0:k0".encode(), b"j1-0:k0")
            )
            fh.write(repeat + b"\n")
            lines += 1
        again.wait_lines(lines, timeout_s=600)
        rss = again.hwm_mb()
    finally:
        found = again.stop()
    if not any(f.get("kind") == "duplicate_apply" and f.get("idempotency_key") == "j1-0:k0"
               for f in found):  # fmt: skip
        raise BenchError(f"the follower with {keys} keys of history missed the repeated first key")
    state_mb = sum(p.stat().st_size for p in state.iterdir()) / 1e6
    point = Point(keys, log_mb, round(catchup, 2),
                  catchup_hwm, round(state_mb, 1), rss)  # fmt: skip
    for path in (log, *state.iterdir()):
        path.unlink()
    return point


def run(ctx: Context) -> BenchResult:
    result = BenchResult("follow")
    sizes = [BASE_KEYS, 100_000] if ctx.quick else [BASE_KEYS, 100_000, 1_000_000, 10_000_000]
    points = [measure(ctx, n) for n in sizes]
    base, top = points[0], points[-1]
    result.figures.append(
        Figure(
            name="follow.rss_mb",
            what=f"ops detect --follow restarted on {top.keys} keys of history, then following",
            subject_label=f"{top.keys} keys ({top.log_mb:.0f} MB of log)",
            baseline_label=f"{base.keys} keys",
            unit="MB",
            subject={"peak_rss_mb": top.rss_mb},
            baseline={"peak_rss_mb": base.rss_mb},
            ratio=top.rss_mb / base.rss_mb,
            ratio_means="VmHWM / VmHWM of a follower with 10^3 keys of history",
            goal=Goal("<=", 1.2, "<= 1.2x a fresh follower"),
        )
    )
    result.notes.append(
        "Every size (catch-up: the first follower over the whole log; restarted: the same "
        "state dir, then the live traffic):\n\n"
        "| keys | log MB | catch-up s | catch-up MB/s | catch-up VmHWM MB | state MB "
        "| restarted VmHWM MB |\n|---|---|---|---|---|---|---|\n"
        + "\n".join(
            f"| {p.keys:.0e} | {p.log_mb:.0f} | {p.catchup_s:.1f} | "
            f"{p.log_mb / max(p.catchup_s, 1e-6):.0f} | {p.catchup_hwm_mb:.0f} | "
            f"{p.state_mb:.0f} | {p.rss_mb:.0f} |"
            for p in points
        )
    )
    result.notes.append(
        "Every restarted follower reported the log's first key, applied again after its "
        "whole history, as duplicate_apply. The catch-up peak is bounded by a poll's read "
        "budget (16 MB of lines a file), so it is flat once a backlog passes it."
    )
    return result
