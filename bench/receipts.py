"""Durable receipt records per second against raw appends of the same lines.

Subject: ``ReceiptStore.begin`` + ``ReceiptStore.finish`` (an intent and an outcome:
two records, each appended and synced under the store's locks: one ``RWF_DSYNC``
write per record, ``runner/core/durable.py``). Baseline: raw
``os.write`` + ``os.fsync`` appends of lines of the same sizes to an open
``O_APPEND`` file. One writer, then eight concurrent writers (eight threads, as the
tool server's thread pool runs them), each with its own slot directory and file.

Goals: one writer reaches at least 0.9x the raw rate; eight concurrent slots reach
at least 3x the one-writer rate of the store.

Floors, with the store's own primitive: for one writer, raw ``RWF_DSYNC`` writes of
the same lines (``receipts.raw_dsync``; the raw arm itself where appends fall back to
write + fsync); for eight slots, what such raw writers reach with eight threads
against one in the same run (``receipts.raw_dsync_scaling``, else
``receipts.raw_scaling``): the store can scale no further than the syncs do.

Two more arms, reported without a goal, say where the eight-slot gap lies: the same
store writers as eight *processes* against one process (``receipts.eight_processes``):
the store's own scaling with no interpreter lock shared between the slots.

The floor of the store's design, beside the raw one: each raw write inside the
store's other system calls for a record (``flock``, ``stat``, then ``lseek`` and
unlock: docs/architecture.md §Receipts), through ``os`` and with no other Python, one
writer (``receipts.protocol_calls``) and eight (``receipts.protocol_calls_scaling``).
The floors' notes set the store against them: what the protocol's calls cost apart
from the Python around them, and how far the calls alone come to the raw floor.

Where the one-writer gap lies: the least Python around those calls
(``receipts.lean_python``: an f-string line, a dict index), and the same lean writer
with its line made by the store's record model (``receipts.lean_model``: a ``Receipt``
encoded and checked by decoding its line back, ``record_of``), each against the raw
floor.

And what a record costs in CPU: the one-writer arms keep each thread's CPU time, and
two arms on tmpfs (``/dev/shm``, where a sync waits for no device) run the same store
writer as it is and asleep before each record, so its CPU idles as it does while a
synced write waits. A note sets these against the eight-slot figure: the scaling the
CPU time of a record allows on this host.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.fixtures import REPO_ROOT, Context
from bench.receipts_writer import READY, store_writer
from bench.stats import (
    BenchResult,
    Figure,
    Floor,
    Goal,
    Run,
    floor_figure,
    interleave,
    rate_ratio,
    summarize,
)
from runner.core import durable
from tools.receipts.format import record_of
from tools.receipts.store import RECEIPTS_FILE, Receipt, Status, utc_stamp

ONE_GOAL = Goal(">=", 0.9, ">= 0.9x the raw append+fsync rate (one writer)")
EIGHT_GOAL = Goal(">=", 3.0, ">= 3x the one-writer rate (eight concurrent slots)")
WRITERS = 8
MEMORY_FS = Path("/dev/shm")
IDLE_S = 200e-6  # the idle arm's sleep before each record: about one synced write here


class _Dirs:
    """A fresh directory per writer per run, so every run starts from an empty file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def new(self) -> Path:
        self.count += 1
        path = self.root / f"slot-{self.count:05d}"
        path.mkdir(parents=True)
        return path


def _lean_writer(slot_dir: Path, pairs: int, tag: str, model: bool = False) -> list[float]:
    """The least Python around the store's record: per record the same system calls
    (``flock``, ``stat``, the ``RWF_DSYNC`` write, ``lseek``, unlock) through ``os``, a
    line of the same fields built by one f-string and a ``strftime`` (no model, no
    validation, no escaping), and a dict as the index. ``pairs`` intent+outcome pairs.

    With ``model``, the line is the store's own instead: the record built as
    :class:`Receipt`, encoded and checked by :func:`record_of`, with the store's clock; the
    rest stays as lean. What the record model alone costs around a sync."""
    lock_fd = os.open(slot_dir / "lean.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    path = str(slot_dir / "lean.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    index: dict[str, list[str]] = {}
    digest, pre = "0" * 64, "1" * 64
    durations: list[float] = []
    try:
        for i in range(pairs):
            key = f"{tag}:k{i}"
            for status in ("intent", "applied"):
                start = time.perf_counter()
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                try:
                    os.stat(path)
                    if model:
                        record = Receipt(
                            key=key,
                            job_id=f"job-{tag}",
                            attempt=1,
                            slot_id=slot_dir.name,
                            generation=7,
                            tool="write_file",
                            relpath=f"src/module_{i % 50}.py",
                            digest=digest,
                            status=Status(status),
                            ts=utc_stamp(),
                            pre_digest=pre,
                            result={"bytes": 120} if status == "applied" else None,
                        )
                        line = record_of(record)[1]
                    else:
                        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
                        result = ',"result":{"bytes":120}' if status == "applied" else ""
                        line = (
                            f'{{"key":"{key}","job_id":"job-{tag}","attempt":1,'
                            f'"slot_id":"{slot_dir.name}","generation":7,"tool":"write_file",'
                            f'"relpath":"src/module_{i % 50}.py","digest":"{digest}",'
                            f'"status":"{status}","ts":"{ts}.000000Z"{result},'
                            f'"pre_digest":"{pre}"}}\n'
                        ).encode()
                    os.pwritev(fd, (line,), -1, os.RWF_DSYNC)
                    os.lseek(fd, 0, os.SEEK_CUR)
                    index.setdefault(key, []).append(status)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
                durations.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.close(lock_fd)
    return durations


def _raw_writer(
    slot_dir: Path,
    lines: list[bytes],
    records: int,
    *,
    dsync: bool = False,
    protocol: bool = False,
) -> list[float]:
    """``records`` appends cycling through ``lines``, each written and fsynced (or, with
    ``dsync``, each written with ``RWF_DSYNC``: the store's own primitive). With
    ``protocol``, each write sits inside the store's other system calls for a record
    (``flock`` of a lock file, ``stat`` of the file, then after the write ``lseek`` and
    unlock), made through ``os`` with nothing else around them."""
    path = str(slot_dir / "raw.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock_fd = os.open(slot_dir / "raw.lock", os.O_RDWR | os.O_CREAT, 0o644) if protocol else -1
    durations: list[float] = []
    try:
        for i in range(records):
            line = lines[i % len(lines)]
            start = time.perf_counter()
            if protocol:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                os.stat(path)
            if dsync:
                os.pwritev(fd, (line,), -1, os.RWF_DSYNC)
            else:
                os.write(fd, line)
                os.fsync(fd)
            if protocol:
                os.lseek(fd, 0, os.SEEK_CUR)
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
            durations.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        if lock_fd >= 0:
            os.close(lock_fd)
    return durations


@dataclass(frozen=True)
class CpuUse:
    """The CPU time one writer thread spent on its records: the total from the thread's
    CPU clock, split into user and system time in the proportion ``RUSAGE_THREAD``
    reports (the kernel samples that split at each tick; the clock is exact)."""

    total_s: float
    user_share: float
    records: int

    @property
    def user_us(self) -> float:
        return self.total_s * self.user_share / self.records * 1e6

    @property
    def system_us(self) -> float:
        return self.total_s * (1 - self.user_share) / self.records * 1e6


def _thread_cpu() -> tuple[float, float, float]:
    """This thread's CPU clock, and its user and system time as ``getrusage`` has them."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return time.thread_time(), usage.ru_utime, usage.ru_stime


def _cpu_use(start: tuple[float, float, float], records: int) -> CpuUse:
    clock, user, system = (end - begin for end, begin in zip(_thread_cpu(), start, strict=True))
    sampled = user + system
    return CpuUse(clock, user / sampled if sampled > 0 else 1.0, records)


def _threads(
    jobs: list[tuple[Path, str]],
    records: int,
    lines: list[bytes] | None,
    *,
    dsync: bool = False,
    cpu: list[CpuUse] | None = None,
    pause: float = 0.0,
    lean: bool = False,
    model: bool = False,
    protocol: bool = False,
) -> Run:
    """The writers of ``jobs`` as threads: the store's (``lines`` None), the lean ones
    (``lean``; with ``model``, their lines built by the store's record model), else raw
    writers of ``lines`` (inside the store's other system calls with ``protocol``); with
    ``cpu``, each thread's CPU time is added to it."""
    barrier = threading.Barrier(len(jobs) + 1)
    results: list[list[float]] = [[] for _ in jobs]
    errors: list[BaseException] = []

    def worker(index: int, slot_dir: Path, tag: str) -> None:
        try:
            barrier.wait()
            start = _thread_cpu()
            if lean:
                results[index] = _lean_writer(slot_dir, records // 2, tag, model)
            elif lines is None:
                results[index] = store_writer(slot_dir, records // 2, tag, pause)
            else:
                results[index] = _raw_writer(
                    slot_dir, lines, records, dsync=dsync, protocol=protocol
                )
            if cpu is not None:
                cpu.append(_cpu_use(start, len(results[index])))
        except BaseException as exc:  # surfaced in the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(i, d, t), daemon=True)
        for i, (d, t) in enumerate(jobs)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    durations = tuple(d for per in results for d in per)
    return Run(durations, wall, len(durations))


def _processes(jobs: list[tuple[Path, str]], records: int) -> Run:
    """The store writers of ``jobs`` as processes (``bench.receipts_writer``); the wall
    time runs from the start every child waits for once its imports are done, so their
    interpreters start outside it.

    Fresh interpreters, not ``multiprocessing`` children: a forked one runs every
    after-fork handler of the parent's libraries (kombu's closes pooled broker
    connections, which hangs on one waiting in ``BRPOP``: CHANGELOG, the detector's
    reader), and a spawned one imports the parent's main module, ``bench.run``, with
    every benchmark's libraries."""
    children: list[subprocess.Popen[str]] = []
    try:
        for slot_dir, tag in jobs:
            argv = ["-m", "bench.receipts_writer", str(slot_dir), str(records // 2), tag]
            children.append(
                subprocess.Popen(
                    [sys.executable, *argv],
                    cwd=REPO_ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != READY:
                child.kill()
                raise RuntimeError(f"a store writer process failed: {child.communicate()[1]}")
        start = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        replies = [child.communicate() for child in children]
        wall = time.perf_counter() - start
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    durations: list[float] = []
    for child, (out, err) in zip(children, replies, strict=True):
        if child.returncode != 0:
            raise RuntimeError(f"a store writer process failed: {err.strip()}")
        durations += json.loads(out)
    return Run(tuple(durations), wall, len(durations))


def run(ctx: Context) -> BenchResult:
    result = BenchResult("receipts")
    # Nine repetitions in a full run: a pair's ratio swings by a third on this kind of
    # host (a synced write's latency drifts), and the figures are medians of pairs.
    reps, records = ctx.pick(3, 9), ctx.pick(200, 2_000)
    dirs = _Dirs(ctx.dir("receipts"))

    # A warm-up run of the store gives the sizes of its lines for the raw arm.
    sample = dirs.new()
    store_writer(sample, 50, "warm")
    lines = (sample / RECEIPTS_FILE).read_bytes().splitlines(keepends=True)
    runs_made = 0
    # The floors use the store's own primitive: an RWF_DSYNC write per record where the
    # durable writer uses one (runner/core/durable.py), else write + fsync.
    synced = durable.synced_appends()

    # CPU time per record of the one-writer arms, and of the store on a memory file
    # system: where a record's time goes besides the device's wait.
    cpu: dict[str, list[CpuUse]] = {
        arm: [] for arm in ("store1", "raw1", "dsync1", "memory1", "idle1")
    }
    memory_root = _memory_root()
    memory_dirs = _Dirs(memory_root) if memory_root is not None else None

    def store_runs(
        writers: int, on: _Dirs = dirs, use: list[CpuUse] | None = None, pause: float = 0.0
    ) -> Run:
        nonlocal runs_made
        runs_made += 1
        jobs = [(on.new(), f"r{runs_made}w{w}") for w in range(writers)]
        return _threads(jobs, records, None, cpu=use, pause=pause)

    def raw_runs(
        writers: int, dsync: bool = False, use: list[CpuUse] | None = None, protocol: bool = False
    ) -> Run:
        jobs = [(dirs.new(), "") for _ in range(writers)]
        return _threads(jobs, records, lines, dsync=dsync, cpu=use, protocol=protocol)

    def process_runs(writers: int) -> Run:
        nonlocal runs_made
        runs_made += 1
        return _processes([(dirs.new(), f"p{runs_made}w{w}") for w in range(writers)], records)

    arms = {
        "store1": lambda _: store_runs(1, use=cpu["store1"]),
        "raw1": lambda _: raw_runs(1, use=cpu["raw1"]),
        "store8": lambda _: store_runs(WRITERS),
        "raw8": lambda _: raw_runs(WRITERS),
        "dsync1": lambda _: raw_runs(1, dsync=True, use=cpu["dsync1"]),
        "dsync8": lambda _: raw_runs(WRITERS, dsync=True),
        "proc1": lambda _: process_runs(1),
        "proc8": lambda _: process_runs(WRITERS),
        "lean1": lambda _: _threads([(dirs.new(), "lean")], records, None, lean=True),
        "model1": lambda _: _threads([(dirs.new(), "model")], records, None, lean=True, model=True),
        # The store's five system calls a record and nothing else, with its primitive.
        "calls1": lambda _: raw_runs(1, dsync=synced, protocol=True),
        "calls8": lambda _: raw_runs(WRITERS, dsync=synced, protocol=True),
    }
    if memory_dirs is not None:
        arms["memory1"] = lambda _: store_runs(1, on=memory_dirs, use=cpu["memory1"])
        arms["idle1"] = lambda _: store_runs(1, on=memory_dirs, use=cpu["idle1"], pause=IDLE_S)
    try:
        runs = interleave(reps, arms)
    finally:
        if memory_root is not None:
            shutil.rmtree(memory_root, ignore_errors=True)
    one, one_low, one_high = rate_ratio(runs["store1"], runs["raw1"])
    low1, low8 = ("dsync1", "dsync8") if synced else ("raw1", "raw8")
    dsync_gain = rate_ratio(runs["dsync1"], runs["raw1"])
    # The protocol's own system calls (receipts.protocol_calls): the floor of this store's
    # design, reported beside the raw floor the verdict uses.
    calls = rate_ratio(runs["calls1"], runs[low1])
    versus_calls = rate_ratio(runs["store1"], runs["calls1"])
    calls_note = (
        f"against the protocol's system calls alone (receipts.protocol_calls: flock, stat, "
        f"the synced write, lseek, unlock through os and nothing else, {calls[0]:.3g}x the "
        f"raw floor's rate) the store is at {versus_calls[0]:.3g}x (pairs: "
        f"{versus_calls[1]:.3g} .. {versus_calls[2]:.3g}); within 1.2x: "
        f"{'yes' if versus_calls[0] * 1.2 >= 1 else 'no'}"
    )
    if synced:
        d_ratio, d_low, d_high = rate_ratio(runs["store1"], runs["dsync1"])
        one_floor = Floor(
            name="receipts.raw_dsync",
            what="raw RWF_DSYNC writes of the same lines (the store's primitive), one writer",
            value=dsync_gain[0],
            ratio=d_ratio,
            ratio_means="store records/s / raw RWF_DSYNC records/s",
            higher_is_better=True,
            spread=(d_low, d_high),
            note=calls_note,
        )
    else:
        one_floor = Floor(
            name="the raw arm (receipts.one_writer's baseline)",
            what="raw os.write + os.fsync of the same lines: the baseline is the floor",
            value=1.0,
            ratio=one,
            ratio_means="store records/s / raw records/s",
            higher_is_better=True,
            spread=(one_low, one_high),
            note=calls_note,
        )
    result.figures.append(
        Figure(
            name="receipts.one_writer",
            what="records/s of one writer: ReceiptStore begin+finish vs raw write+fsync",
            subject_label="ReceiptStore.begin + finish (2 records)",
            baseline_label="os.write + os.fsync of same-sized lines",
            unit="records/s",
            subject=summarize(runs["store1"]),
            baseline=summarize(runs["raw1"]),
            ratio=one,
            ratio_means="store records/s / raw records/s",
            spread=(one_low, one_high),
            goal=ONE_GOAL,
            floor=one_floor,
        )
    )
    scale, s_low, s_high = rate_ratio(runs["store8"], runs["store1"])
    raw_scaling = rate_ratio(runs["raw8"], runs["raw1"])
    low_scaling = rate_ratio(runs[low8], runs[low1])
    raw_scale, low_scale = raw_scaling[0], low_scaling[0]
    low_name = "receipts.raw_dsync_scaling" if synced else "receipts.raw_scaling"
    # Per repetition: the store's scaling over raw writers' scaling in the same repetition.
    versus = _scaling_pairs(runs["store8"], runs["store1"], runs[low8], runs[low1])
    calls_scaling = rate_ratio(runs["calls8"], runs["calls1"])
    versus_calls8 = _scaling_pairs(runs["store8"], runs["store1"], runs["calls8"], runs["calls1"])
    # The design's own calls against the raw floor: whether any store of this protocol,
    # with no Python around its calls at all, could come within 1.2x of it.
    calls_vs_raw = _scaling_pairs(runs["calls8"], runs["calls1"], runs[low8], runs[low1])
    calls8_note = (
        f"against the protocol's system calls alone, {WRITERS} threads vs 1 "
        f"(receipts.protocol_calls_scaling: {calls_scaling[0]:.3g}x) the store's scaling is "
        f"at {statistics.median(versus_calls8):.3g}x of theirs (pairs: {min(versus_calls8):.3g} "
        f".. {max(versus_calls8):.3g}); within 1.2x: "
        f"{'yes' if statistics.median(versus_calls8) * 1.2 >= 1 else 'no'}. Those calls "
        f"alone scale {statistics.median(calls_vs_raw):.3g}x as far as the raw writes "
        f"(pairs: {min(calls_vs_raw):.3g} .. {max(calls_vs_raw):.3g}); within 1.2x: "
        f"{'yes' if statistics.median(calls_vs_raw) * 1.2 >= 1 else 'no'}"
    )
    result.figures.append(
        Figure(
            name="receipts.eight_slots",
            what=f"records/s of {WRITERS} concurrent slots vs one slot, both through the store",
            subject_label=f"{WRITERS} threads, ReceiptStore each in its own slot dir",
            baseline_label="1 thread, ReceiptStore (the one-writer arm above)",
            unit="records/s",
            subject=summarize(runs["store8"]),
            baseline=summarize(runs["store1"]),
            ratio=scale,
            ratio_means=f"{WRITERS}-slot records/s / one-slot records/s",
            spread=(s_low, s_high),
            goal=EIGHT_GOAL,
            floor=Floor(
                name=low_name,
                what=f"raw writers, {WRITERS} threads vs 1: how far concurrent syncs scale here",
                value=low_scale,
                ratio=statistics.median(versus),
                ratio_means=f"store {WRITERS}-vs-1 scaling / raw {WRITERS}-vs-1 scaling",
                higher_is_better=True,
                spread=(min(versus), max(versus)),
                note=calls8_note,
            ),
        )
    )
    result.figures.append(
        floor_figure(
            "receipts.raw_scaling",
            f"records/s of {WRITERS} concurrent raw writers vs one raw writer (the floor)",
            (
                f"{WRITERS} threads, os.write + os.fsync, each its own file",
                "1 thread, os.write + os.fsync (the one-writer baseline above)",
            ),
            "records/s",
            (summarize(runs["raw8"]), summarize(runs["raw1"])),
            raw_scaling,
            f"raw {WRITERS}-writer records/s / raw one-writer records/s (a floor)",
        )
    )
    if synced:
        result.figures.append(
            floor_figure(
                "receipts.raw_dsync",
                "records/s of one raw RWF_DSYNC writer vs one raw write + fsync writer",
                ("1 thread, os.pwritev(RWF_DSYNC)", "1 thread, os.write + os.fsync"),
                "records/s",
                (summarize(runs["dsync1"]), summarize(runs["raw1"])),
                dsync_gain,
                "raw RWF_DSYNC records/s / raw write + fsync records/s (a floor)",
            )
        )
        result.figures.append(
            floor_figure(
                low_name,
                f"records/s of {WRITERS} concurrent RWF_DSYNC writers vs one (the floor)",
                (
                    f"{WRITERS} threads, os.pwritev(RWF_DSYNC), each its own file",
                    "1 thread, os.pwritev(RWF_DSYNC)",
                ),
                "records/s",
                (summarize(runs["dsync8"]), summarize(runs["dsync1"])),
                low_scaling,
                f"raw {WRITERS}-writer records/s / raw one-writer records/s (a floor)",
            )
        )
    primitive = "os.pwritev(RWF_DSYNC)" if synced else "os.write + os.fsync"
    result.figures.append(
        floor_figure(
            "receipts.protocol_calls",
            "records/s of the store's system calls alone vs the raw writes of the floor",
            (
                f"1 thread: flock, stat, {primitive}, lseek, unlock; nothing else",
                f"1 thread, {primitive}",
            ),
            "records/s",
            (summarize(runs["calls1"]), summarize(runs[low1])),
            calls,
            "protocol records/s / raw records/s (no goal: what the store's other system "
            "calls leave of the floor)",
        )
    )
    result.figures.append(
        floor_figure(
            "receipts.protocol_calls_scaling",
            f"records/s of {WRITERS} concurrent writers of the store's system calls alone vs one",
            (f"{WRITERS} threads, the same calls, each its own file", "1 thread, the same calls"),
            "records/s",
            (summarize(runs["calls8"]), summarize(runs["calls1"])),
            calls_scaling,
            f"{WRITERS}-writer records/s / one-writer records/s (no goal: a floor of the design)",
        )
    )
    # The least Python around a record, against the same floor as the store.
    lean = rate_ratio(runs["lean1"], runs[low1])
    floor_label = "1 thread, os.pwritev(RWF_DSYNC)" if synced else "1 thread, os.write + os.fsync"
    result.figures.append(
        floor_figure(
            "receipts.lean_python",
            "records/s of the least Python around a record vs the raw writes of the floor",
            (
                "1 thread: the store's system calls via os, an f-string line, a dict index",
                floor_label,
            ),
            "records/s",
            (summarize(runs["lean1"]), summarize(runs[low1])),
            lean,
            "lean records/s / raw records/s (no goal: what Python alone leaves of the floor)",
        )
    )
    # The lean writer with the store's record model: what the model costs around a sync.
    modelled = rate_ratio(runs["model1"], runs[low1])
    result.figures.append(
        floor_figure(
            "receipts.lean_model",
            "records/s of the lean writer with the store's record model vs the raw writes",
            (
                "1 thread: as receipts.lean_python, the line a Receipt through record_of",
                floor_label,
            ),
            "records/s",
            (summarize(runs["model1"]), summarize(runs[low1])),
            modelled,
            "lean+model records/s / raw records/s (no goal: what the record model leaves "
            "of the floor)",
        )
    )
    store_share = one_floor.ratio
    gap = lean[0] - store_share
    if gap <= 0:
        model_part = ""
    elif modelled[0] < lean[0]:
        model_part = (
            f": the model accounts for {(lean[0] - modelled[0]) / gap:.0%} of the gap "
            "between the lean writer and the store"
        )
    else:
        model_part = (
            ", no slower than the lean writer in this run (the arms swing by more than the "
            "model costs)"
        )
    result.notes.append(
        f"The least Python around a record (receipts.lean_python: the store's system "
        f"calls through os, the line built by one f-string, a dict for an index) reaches "
        f"{lean[0]:.2f}x the floor's rate (within 1.2x: {'yes' if lean[0] >= 1 / 1.2 else 'no'}); "
        f"the store reaches {store_share:.2f}x. The same lean writer with only its line "
        f"made by the store's record model (receipts.lean_model: a Receipt through "
        f"record_of, the store's clock) reaches {modelled[0]:.2f}x{model_part}"
        "; the rest of the store's Python (the index, the checks around each append, "
        "the held calls) for what remains. Between the lean writer and the floor lies the "
        "interpreter itself."
    )
    raw8, r_low, r_high = rate_ratio(runs["store8"], runs["raw8"])
    result.figures.append(
        Figure(
            name="receipts.eight_vs_raw",
            what=f"records/s of {WRITERS} concurrent store writers vs {WRITERS} raw writers",
            subject_label=f"{WRITERS} threads, ReceiptStore",
            baseline_label=f"{WRITERS} threads, os.write + os.fsync",
            unit="records/s",
            subject=summarize(runs["store8"]),
            baseline=summarize(runs["raw8"]),
            ratio=raw8,
            ratio_means="store records/s / raw records/s (no goal: reported)",
            spread=(r_low, r_high),
        )
    )
    procs, p_low, p_high = rate_ratio(runs["proc8"], runs["proc1"])
    result.figures.append(
        Figure(
            name="receipts.eight_processes",
            what=f"records/s of {WRITERS} store writers as processes vs one (no shared GIL)",
            subject_label=f"{WRITERS} processes, ReceiptStore each in its own slot dir",
            baseline_label="1 process, ReceiptStore",
            unit="records/s",
            subject=summarize(runs["proc8"]),
            baseline=summarize(runs["proc1"]),
            ratio=procs,
            ratio_means=f"{WRITERS}-process records/s / one-process records/s (no goal: reported)",
            spread=(p_low, p_high),
        )
    )
    result.notes.append(
        f"Where the eight-slot gap lies: the same store writers scale {procs:.2f}x as "
        f"{WRITERS} processes against {scale:.2f}x as {WRITERS} threads of one process "
        f"(raw writers: {low_scale:.2f}x). Of a record's system calls (flock, stat, the "
        "synced write, lseek, unlock) only the synced write lets go of the interpreter "
        "lock (runner/core/heldcalls.py); the store's Python between two syncs runs with "
        "it held: in one process the slots queue for that lock, in several they do not."
    )
    result.notes.append(
        _cpu_note(
            cpu,
            raw="dsync1" if synced else "raw1",
            store_rate=statistics.median(r.rate for r in runs["store1"]),
            measured=(scale, procs, low_scale),
        )
    )
    result.notes.append(
        f"{reps} repetitions of {records} records per writer per arm, interleaved; raw "
        f"lines cycle through the store's own line sizes ({min(map(len, lines))}-"
        f"{max(map(len, lines))} bytes). For scale: {WRITERS} raw writers reached "
        f"{raw_scale:.2f}x the rate of one raw writer here with write + fsync and "
        f"{low_scale:.2f}x with the store's primitive (concurrent syncs overlap in the "
        "device), the headroom the eight-slot figure draws on."
    )
    return result


def _scaling_pairs(
    store8: list[Run], store1: list[Run], other8: list[Run], other1: list[Run]
) -> list[float]:
    """Per repetition: the store's eight-vs-one scaling over another writer's, measured
    in the same repetition."""
    return [
        (s8.rate / s1.rate) / (o8.rate / o1.rate)
        for s8, s1, o8, o1 in zip(store8, store1, other8, other1, strict=True)
    ]


def _memory_root() -> Path | None:
    """A fresh directory on ``/dev/shm`` (tmpfs: a sync waits for no device), or None
    where there is none to write to."""
    if not (MEMORY_FS.is_dir() and os.access(MEMORY_FS, os.W_OK | os.X_OK)):
        return None
    return Path(tempfile.mkdtemp(prefix="slotrunner-bench-receipts-", dir=MEMORY_FS))


def _cpu_note(
    cpu: dict[str, list[CpuUse]],
    *,
    raw: str,
    store_rate: float,
    measured: tuple[float, float, float],
    cores: int | None = None,
) -> str:
    """What a record costs in CPU, and the eight-slot scaling that cost allows on this host."""
    scale, procs, raw_scale = measured

    def per_record(arm: str) -> tuple[float, float]:
        uses = cpu[arm]
        return (
            statistics.median(u.user_us for u in uses),
            statistics.median(u.system_us for u in uses),
        )

    user, system = per_record("store1")
    raw_user, raw_system = per_record(raw)
    cores = cores or os.cpu_count() or 1
    wall = 1e6 / store_rate  # one writer's time per record, in microseconds
    primitive = "RWF_DSYNC" if raw == "dsync1" else "write + fsync"
    text = (
        f"CPU time per record, one writer (the thread's CPU clock, split as RUSAGE_THREAD "
        f"samples it; medians over repetitions): the "
        f"store {user:.0f} us user + {system:.0f} us system of {wall:.0f} us per record; "
        f"raw {primitive} writes {raw_user:.0f} + {raw_system:.0f} us."
    )
    if cpu["memory1"]:
        memory_user, memory_system = per_record("memory1")
        idle_user, idle_system = per_record("idle1")
        idled = idle_user >= 1.5 * memory_user  # the slowdown shows without a device
        asleep = (
            f"with the writer asleep {IDLE_S * 1e6:.0f} us before each record (its CPU "
            f"idles, as it does while a synced write waits) they cost {idle_user:.0f} + "
            f"{idle_system:.0f} us"
        )
        text += (
            f" The same store records on tmpfs, where a sync waits for no device, cost "
            f"{memory_user:.0f} + {memory_system:.0f} us; here the store's user time is "
            f"{user / max(memory_user, 1e-9):.1f}x that."
        )
        text += (
            f" Not the device's doing: on tmpfs {asleep}; the Python between two syncs "
            "runs on a CPU that went idle meanwhile, and takes longer there."
            if idled
            else f" On tmpfs {asleep}, so idling alone does not explain it."
        )
    text += (
        f" On this {cores}-CPU host that cost bounds eight slots whatever the locks do: "
        f"with every CPU busy on records, at most {cores * wall / (user + system):.2f}x one "
        f"writer; with the store's user time serialised under the interpreter lock "
        f"(threads), at most about {wall / max(user, 1e-9):.2f}x. Measured: {scale:.2f}x as "
        f"threads, {procs:.2f}x as processes; raw writers, at {raw_user + raw_system:.0f} us "
        f"of CPU a record, {raw_scale:.2f}x."
    )
    return text
