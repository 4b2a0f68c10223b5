"""Flat cost as a slot's history grows (#17 item 5): an old slot against a fresh one.

A slot that has served 10,000 jobs holds about 10^6 receipt records. Its tool server's
start time, memory, per-call cost and receipt lookups should stay within 1.2x of a
fresh slot's. The slot's history is built through the real pool and store
(``bench.history_slot``): R = 100 records a generation, so 10^3 records are 10
generations and 10^6 are 10,000 (``--quick``: 10^3 and 10^4). The sizes grow one slot
in turn; at each size a fresh slot (a new home that has served no job) is measured
beside it. Each repetition (four, so each slot's server starts first as often as the
other's; one with ``--quick``):

- start the real tool server (``slotrunner toolserver``) on each slot's home, one after
  the other (the order turning each repetition), and time each until ``/healthz``
  answers (its start-up runs ``service.recover()`` over the slot); its own CPU seconds
  by then are reported beside, a figure a busy host disturbs less than wall time;
- each server's resident high-water mark (``VmHWM``) then, and after the calls below;
- lease a new generation of each slot (``SlotPool.lease``) and make ``write_file`` calls
  through ``ToolClient`` (every call a new key, so every call applies), the two slots
  taking turns call by call (AB, BA, ...) so a passing load falls on both: p50, p99;
- ``GET /v1/receipts/{key}?slot=S0`` of a key of the new generation and of the slot's
  oldest key (generation 1), which must still answer its receipt (a receipt is kept
  for audit; the benchmark fails otherwise), taking turns likewise: p50 of each; then
  release both slots and stop both servers.

Then the size of what the slot keeps: its hot receipt file, and everything outside
its tree (the hot file, any archive of the store, stamp, token records).

Both slots live on tmpfs (``/dev/shm`` when there is one): a lease and its release make
six fsyncs or more that the build cannot skip (the pool has no fsync seam), and at
~5 ms an fsync 10,000 leases would wait five minutes on them alone; and an fsync costs
an old slot what it costs a fresh one, so what the figures show is what history
changes: CPU, reads, memory.

Figures at the largest size, each the median over repetitions of (old slot / fresh
slot): ``history.start_s``, ``history.rss_mb``, ``history.call_ms`` (p50),
``history.lookup_ms`` and ``history.lookup_old_ms`` (p50). Goal: each <= 1.2x a fresh
slot. ``history.hot_file_mb`` is reported without a goal. The notes hold every size's
table; a full run draws ``bench/history.png``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from bench.capacity import proc_cpu_s
from bench.fixtures import REPO_ROOT, Context, child_env
from bench.history_report import Point, Session, figures, plot, table
from bench.history_slot import SlotHistory
from bench.machine import vm_hwm_mb
from bench.stats import BenchError, BenchResult, Run
from ops.testing.stack import free_port, start_toolserver
from runner.slots.pool import Lease
from tools.client import ToolClient
from tools.envelope import Envelope

SIZES_FULL = (1_000, 100_000, 1_000_000)
SIZES_QUICK = (1_000, 10_000)
PLOT = REPO_ROOT / "bench" / "history.png"
START_TIMEOUT_S = 300.0  # a start-up that reads the whole history takes a while
WARM_CALLS = 8
CONTENT = "x = 1  # written by the history benchmark\n"
TMPFS = Path("/dev/shm")


def alternate(n: int, ops: Mapping[str, Callable[[], object]]) -> dict[str, Run]:
    """``n`` of each op, one at a time, the arms taking turns op by op (AB, BA, AB, ...):
    a load that comes and goes within seconds falls on both arms alike."""
    took: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(n):
        for name in list(ops) if i % 2 == 0 else list(ops)[::-1]:
            started = time.perf_counter()
            ops[name]()
            took[name].append(time.perf_counter() - started)
    return {name: Run(tuple(op_s), sum(op_s), n) for name, op_s in took.items()}


class Served:
    """A real tool server on one slot's home, and a lease of the slot to call under."""

    def __init__(self, slot: SlotHistory, log_dir: Path, stack: contextlib.ExitStack) -> None:
        # Not bench.fixtures.toolserver: its 30 s wait is shorter than a start-up that
        # reads a million records.
        port = free_port()
        served = slot.settings.with_(toolserver_url=f"http://127.0.0.1:{port}")
        started = time.perf_counter()
        self.server = start_toolserver(child_env(served), port, log_dir, timeout_s=START_TIMEOUT_S)
        self.start_s = time.perf_counter() - started
        stack.callback(self.server.stop)
        self.start_cpu_s = proc_cpu_s(self.server.pid)
        self.rss_start_mb = self.rss_mb()
        self.slot = slot
        self.client = ToolClient(served.toolserver_url, timeout_s=60)
        stack.callback(self.client.close)
        self.lease: Lease | None = None
        self.keys: list[str] = []

    def rss_mb(self) -> float:
        peak = vm_hwm_mb(self.server.pid)
        if peak is None:
            raise BenchError(f"the tool server is gone:\n{self.server.tail()}")
        return peak

    def take_lease(self, stack: contextlib.ExitStack) -> None:
        self.lease = self.slot.lease(f"bench-history-{self.slot.generations + 1}")
        stack.callback(self.slot.release, self.lease)

    def write(self) -> None:
        """One write_file under the lease, a new key (so it applies)."""
        assert self.lease is not None
        key = f"{self.lease.job_id}:a1:c{len(self.keys)}:write_file"
        lease = self.lease.model_dump(include={"job_id", "attempt", "slot_id", "generation"})
        envelope = Envelope(**lease, tool="write_file", idempotency_key=key)
        args = {"path": f"bench/history_{len(self.keys) % 16}.py", "content": CONTENT}
        response = self.client.call(envelope, args, slot_dir=self.slot.slot_dir)
        if response.replayed or (response.receipt or {}).get("status") != "applied":
            raise BenchError(f"write_file {key} did not apply: {response}")
        self.keys.append(key)
        self.slot.wrote(2, key)

    def lookup(self, key: str) -> None:
        """``GET /v1/receipts/{key}?slot=S0``, which must answer the key's receipt."""
        response = self.client.http.get(f"/v1/receipts/{key}", params={"slot": "S0"})
        receipt = response.json().get("receipt") if response.status_code == 200 else None
        if not receipt or receipt.get("key") != key or receipt.get("status") != "applied":
            # A key of any generation keeps its receipt (I2): a lost one is a broken
            # slot, not a slow one, and no lookup time can stand for it.
            raise BenchError(f"GET /v1/receipts/{key} answered {response.status_code}: "
                             f"{response.text}")  # fmt: skip


def repetition(
    slots: Mapping[str, SlotHistory], rep: int, log_dir: Path, calls: int, lookups: int
) -> dict[str, Session]:
    """A tool server on each slot, started one after the other (the order rotating each
    repetition), a lease of each, then their calls and lookups taking turns."""
    order = list(slots) if rep % 2 == 0 else list(slots)[::-1]
    with contextlib.ExitStack() as stack:
        live = {name: Served(slots[name], log_dir / name, stack) for name in order}
        for served in live.values():
            served.take_lease(stack)
        alternate(WARM_CALLS, {name: served.write for name, served in live.items()})
        call_runs = alternate(calls, {name: served.write for name, served in live.items()})
        runs: dict[str, dict[str, Run]] = {"calls": call_runs}
        for which in ("now", "old"):
            ops = {name: _lookup_op(served, which) for name, served in live.items()}
            alternate(WARM_CALLS, ops)
            runs[which] = alternate(lookups, ops)
        return {
            name: Session(
                start_s=served.start_s,
                start_cpu_s=served.start_cpu_s,
                rss_start_mb=served.rss_start_mb,
                rss_mb=served.rss_mb(),
                calls=runs["calls"][name],
                lookup=runs["now"][name],
                lookup_old=runs["old"][name],
                old_answered=runs["old"][name].ops,  # each lookup raises unless answered
            )
            for name, served in live.items()
        }


def _lookup_op(served: Served, which: str) -> Callable[[], None]:
    key = served.keys[0] if which == "now" else served.slot.oldest_key
    assert key is not None
    return lambda: served.lookup(key)


@contextlib.contextmanager
def _homes(ctx: Context) -> Iterator[Path]:
    """Where the slots live: a directory on tmpfs if there is one, removed at the end."""
    if not (TMPFS.is_dir() and os.access(TMPFS, os.W_OK)):
        yield ctx.dir("history-homes")  # the run's scratch, removed by bench.run
        return
    path = Path(tempfile.mkdtemp(prefix="slotrunner-history-", dir=TMPFS))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def compare(
    slots: Mapping[str, SlotHistory], reps: int, log_dir: Path, calls: int, lookups: int
) -> dict[str, list[Session]]:
    """``reps`` repetitions on both slots; each slot's sessions, in order."""
    sessions: dict[str, list[Session]] = {name: [] for name in slots}
    for rep in range(reps):
        for name, one in repetition(slots, rep, log_dir, calls, lookups).items():
            sessions[name].append(one)
    return sessions


def measure(ctx: Context, sizes: Sequence[int]) -> tuple[list[Point], bool]:
    """Every size's point; whether the slots were on tmpfs."""
    reps, calls, lookups = ctx.pick(1, 4), ctx.pick(40, 120), ctx.pick(20, 40)
    logs = ctx.dir("history")
    points: list[Point] = []
    with _homes(ctx) as homes:
        old = SlotHistory.open(homes / "history", ctx.redis_url, "history")
        try:
            for size in sizes:
                ctx.log(f"history: building {size:,} records")
                before = old.generations
                build_s = old.grow(size, lambda msg: ctx.log(f"history: {msg}"))
                at, generations = old.records, old.generations
                ctx.log(f"history: {at:,} records; {reps} repetition(s) of both servers")
                fresh = SlotHistory.open(homes / f"fresh-{size}", ctx.redis_url, "fresh")
                try:
                    slots = {"history": old, "fresh": fresh}
                    sessions = compare(slots, reps, logs, calls, lookups)
                    disk = {name: slot.disk() for name, slot in slots.items()}
                finally:
                    fresh.close()
                built = generations - before
                points.append(Point(size, at, generations, built, build_s, sessions, disk))
        finally:
            old.close()
        on_tmpfs = homes.is_relative_to(TMPFS)
    return points, on_tmpfs


def run(ctx: Context) -> BenchResult:
    result = BenchResult("history")
    sizes = SIZES_QUICK if ctx.quick else SIZES_FULL
    points, on_tmpfs = measure(ctx, sizes)
    result.figures += figures(points[-1])
    where = "on tmpfs" if on_tmpfs else "in the run's scratch directory (no tmpfs here)"
    first = points[-1].sessions["history"][0]
    result.notes.append(
        f"Sizes {', '.join(f'{s:,}' for s in sizes)} records, built one after the other on "
        f"one slot, {where}; at each size {len(points[-1].sessions['history'])} "
        f"repetition(s) of both servers, each with {first.calls.ops} write_file calls "
        f"(after {WARM_CALLS} warm-up calls) and {first.lookup.ops} lookups of each key."
    )
    if ctx.quick:
        result.notes.append(f"plot: none from a quick run (bench/{PLOT.name} is a full run's)")
    else:
        result.notes.append(f"plot: {plot(points, PLOT)}")
    result.notes.append(table(points))  # last: a table, which ends the list of notes
    return result
