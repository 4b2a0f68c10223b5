"""Capacity of one host: where tool calls/s and jobs/s stop growing, and why (#17 item 4).

Curve 1, tool calls: for C in 1, 2, 4, 8, 16, C agents work at once, each on its own
leased slot with its own ``ToolClient``, each making the same number of ``write_file``
calls (a fresh idempotency key per call, so every call applies) to ONE real tool
server. Baseline at the same C: C clients of the no-op server (``bench.noop_server``),
each call a bare httpx POST of the same body and one ``os.write`` + ``os.fsync``, as
in ``pipeline``. Per C: calls/s (median over repetitions), p50 and p99 per call (all
repetitions pooled), and calls/s over the baseline's at the same C (the median of the
repetition pairs; the arms are interleaved).

Curve 2, jobs: for S in 1, 2, 4, 8, a pool of S slots (a tool server and a Celery
worker of concurrency S) runs batches of ``e2e``'s scripted 10-call job. Per S: jobs/s,
the median job time (p50), and jobs/s over that of one slot. The four pools start and
warm up at once (their start-ups overlap; on 2 cores that halves the wait), then run
their batches one pool at a time while the others sit idle.

The agents are threads of this process, not processes. On 2 cores that is the fair
split: the tool server is one Python process, held to about one core by its GIL, and
the agent threads are held to one core by theirs, so neither side can take the other's
core. The client can still be what limits; that is measured, not assumed away: around
every run the CPU time of the server (``/proc/<pid>/stat``), of this process (every
agent thread) and of the whole host (``/proc/stat``) is sampled and reported as cores.

The knee of a curve is the smallest level after which the rate grows less than 10 %
when the level doubles. Its "why" is read off the first level that failed to grow:
the server CPU-bound (near one core), the client CPU-bound, the host's cores all busy,
or none (the calls wait: fsync, a serial path). Curves have no goal. A full run draws
them in ``bench/capacity.png`` when matplotlib (the ``plot`` extra) is installed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench.capacity_curve import Curve, Side, write_plot
from bench.e2e import Stack
from bench.e2e_job import repo_files
from bench.fixtures import (
    REPO_ROOT,
    Context,
    child_env,
    lease_slot,
    make_repo,
    noop_server,
    settings_for,
    toolserver,
)
from bench.machine import children
from bench.stats import BenchResult, Figure, Run, interleave, rate_ratio, summarize
from ops.testing.stack import start_worker
from runner.core.stamp import Stamp
from runner.worker.celery_app import create_app
from tools.client import ToolClient
from tools.envelope import Envelope

AGENTS = (1, 2, 4, 8, 16)  # each level doubles the one before: the knee's rule needs it
SLOTS = (1, 2, 4, 8)
FIRST_DB = 5  # databases 1-4 are e2e's and envs': a pool's worker must take only its jobs
PLOT = REPO_ROOT / "bench" / "capacity.png"
CONTENT = "x = 1  # written by the capacity benchmark\n"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


# -- CPU clocks ------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of the children it reaped (git, the sandbox); 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The name may hold spaces and ')': utime, stime, cutime, cstime follow the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return sum(int(v) for v in fields[11:15]) * _TICK_S


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its direct children (a prefork worker and its pool)."""
    return sum(proc_cpu_s(p) for p in (pid, *children(pid)))


def host_busy_s() -> float:
    """CPU seconds the host's cores were not idle since boot (every process, every user)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) * _TICK_S  # less idle and iowait


@dataclass(frozen=True)
class Usage:
    """CPU seconds spent by the server, the client side and the host over ``wall_s``."""

    server_s: float
    client_s: float
    host_s: float
    wall_s: float

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.server_s + other.server_s, self.client_s + other.client_s,
                     self.host_s + other.host_s, self.wall_s + other.wall_s)  # fmt: skip

    def side(self, runs: Sequence[Run], client: str) -> Side:
        """The runs' summary with the CPU per operation and the cores each side kept busy."""
        wall, ops = self.wall_s or float("inf"), sum(run.ops for run in runs)
        return {
            **summarize(runs),
            "server_cpu_ms_per_op": round(1e3 * self.server_s / ops, 3),
            "server_cores": round(self.server_s / wall, 3),
            f"{client}_cores": round(self.client_s / wall, 3),
            "host_cores": round(self.host_s / wall, 3),
        }


NOTHING = Usage(0.0, 0.0, 0.0, 0.0)


def metered(
    span: Callable[[], Run], server: Callable[[], float], client: Callable[[], float]
) -> tuple[Run, Usage]:
    """``span()``, and the CPU the server, the client and the host spent while it ran."""
    before = (server(), client(), host_busy_s())
    run = span()
    after = (server(), client(), host_busy_s())
    server_s, client_s, host_s = (b - a for a, b in zip(before, after, strict=True))
    return run, Usage(server_s, client_s, host_s, run.wall_s)


# -- curve 1: agents against one tool server --------------------------------------------


class Agent:
    """One agent: its slot, a ToolClient to the tool server, an httpx client to the no-op."""

    def __init__(
        self, leased: tuple[Stamp, Path], urls: tuple[str, str], noop_dir: Path, tls: ssl.SSLContext
    ) -> None:
        stamp, self.slot_dir = leased
        assert stamp.job_id is not None and stamp.attempt is not None
        self.template = Envelope(job_id=stamp.job_id, attempt=stamp.attempt,
                                 slot_id=stamp.slot_id, generation=stamp.generation,
                                 tool="write_file")  # fmt: skip
        # ToolClient's own transport but for one shared TLS context (the URLs are plain
        # http): loading the CA bundle per client cost ~0.1 s each, 16 times over.
        self.client = ToolClient(urls[0], timeout_s=30,
                                 transport=httpx.HTTPTransport(retries=0, verify=tls))  # fmt: skip
        self.bare = httpx.Client(base_url=urls[1], timeout=30,
                                 transport=httpx.HTTPTransport(retries=0, verify=tls))  # fmt: skip
        path = noop_dir / f"{stamp.slot_id}.jsonl"
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.keys = itertools.count()

    def _next(self, i: int) -> tuple[Envelope, dict[str, str]]:
        key = f"capacity:{self.template.slot_id}:{next(self.keys)}"
        args = {"path": f"bench/out_{i % 16}.py", "content": CONTENT}
        return self.template.model_copy(update={"idempotency_key": key}), args

    def tool_call(self, i: int) -> None:
        envelope, args = self._next(i)
        response = self.client.call(envelope, args, slot_dir=self.slot_dir)
        if response.replayed or (response.receipt or {}).get("status") != "applied":
            raise RuntimeError(f"write_file did not apply: {response}")

    def noop_call(self, i: int) -> None:
        envelope, args = self._next(i)
        body = {"envelope": envelope.model_dump(), "args": args}
        response = self.bare.post("/v1/tools/write_file", json=body)
        response.raise_for_status()
        os.write(self.fd, (response.text + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        self.client.close()
        self.bare.close()
        os.close(self.fd)


def together(calls: Sequence[Callable[[int], None]], n: int) -> Run:
    """Each of ``calls`` made ``n`` times in a thread of its own, all released at once."""
    gate = threading.Barrier(len(calls) + 1)

    def agent(call: Callable[[int], None]) -> list[float]:
        gate.wait()
        took = []
        for i in range(n):
            start = time.perf_counter()
            call(i)
            took.append(time.perf_counter() - start)
        return took

    with ThreadPoolExecutor(len(calls)) as threads:
        running = [threads.submit(agent, call) for call in calls]
        gate.wait()
        start = time.perf_counter()
        took = [f.result() for f in running]  # an agent's failure is raised here
        wall = time.perf_counter() - start
    return Run(tuple(d for per in took for d in per), wall, n * len(calls))


def call_curve(ctx: Context) -> tuple[list[Figure], Curve, str]:
    reps, n = ctx.pick(2, 3), ctx.pick(15, 100)
    work = ctx.dir("capacity/calls")
    settings = settings_for(work / "home", ctx.redis_url, slots=max(AGENTS), name="capacity")
    base = make_repo(work / "repo", {"README": "capacity\n"})
    figures, curve = [], Curve("calls/s", "C")
    tls, noop_dir = ssl.create_default_context(), ctx.dir("capacity/calls/noop")
    with contextlib.ExitStack() as stack:
        settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        noop_url, noop = noop_server(work / "logs")
        stack.callback(noop.stop)
        agents: list[Agent] = []
        for k in range(max(AGENTS)):
            leased = lease_slot(settings, work / "repo", base, f"capacity-agent-{k}")
            urls = (settings.toolserver_url, noop_url)
            agents.append(Agent(leased, urls, noop_dir, tls))
            stack.callback(agents[-1].close)
        together([a.tool_call for a in agents], 5)  # connections, receipt and log files
        together([a.noop_call for a in agents], 5)
        for c in AGENTS:
            ctx.log(f"capacity: {c} agent(s), {reps} x {n} calls each per arm")
            tool: list[Callable[[int], None]] = [a.tool_call for a in agents[:c]]
            bare: list[Callable[[int], None]] = [a.noop_call for a in agents[:c]]
            arms = {"tool server": (server.pid, tool), "no-op server": (noop.pid, bare)}
            runs, used = _measure(reps, n, arms)
            subject, baseline = (used[arm].side(runs[arm], "client") for arm in arms)
            ratio, low, high = rate_ratio(runs["tool server"], runs["no-op server"])
            curve.add("tool server", c, subject)
            curve.add("no-op server", c, baseline)
            figures.append(Figure(
                name=f"capacity.calls@C={c}",
                what=f"C agents at once, each on a slot of its own making {n} write_file calls",
                subject_label="a ToolClient per agent -> one tool server",
                baseline_label="an httpx client per agent -> the no-op server, + write + fsync",
                unit="calls/s", subject=subject, baseline=baseline, ratio=ratio,
                ratio_means="tool server calls/s / no-op calls/s at the same C",
                spread=(low, high),
            ))  # fmt: skip
        resent = sum(sum(a.client.decisions.values()) for a in agents)
    note = (f"calls: {reps} repetitions x {n} calls per agent per arm, interleaved; the "
            f"clients took {resent} retry decisions (0: no call was sent twice)")  # fmt: skip
    return figures, curve, note


def _measure(
    reps: int, n: int, arms: dict[str, tuple[int, list[Callable[[int], None]]]]
) -> tuple[dict[str, list[Run]], dict[str, Usage]]:
    """``reps`` interleaved runs of each arm (its server's pid, its agents' calls)."""
    used = dict.fromkeys(arms, NOTHING)

    def arm(name: str) -> Callable[[int], Run]:
        pid, calls = arms[name]

        def one(_rep: int) -> Run:
            # time.process_time: every agent thread's CPU is this process's.
            run, spent = metered(lambda: together(calls, n), lambda: proc_cpu_s(pid),
                                 time.process_time)  # fmt: skip
            used[name] += spent
            return run

        return one

    return interleave(reps, {name: arm(name) for name in arms}), used


# -- curve 2: jobs against slots ---------------------------------------------------------


def _warm_pool(ctx: Context, slots: int, repo: Path, base: str) -> Stack:
    """A tool server and a Celery worker of concurrency ``slots`` on as many slots, warmed
    by a job per slot (pool children forked, the repository cached, worktrees added)."""
    work = ctx.dir(f"capacity/pool-{slots}")
    db = ctx.redis_db(FIRST_DB + SLOTS.index(slots))
    settings = settings_for(work / "home", db, slots=slots, name=f"capacity-{slots}")
    settings, server = toolserver(settings, work / "logs")
    try:
        env = child_env(settings)
        worker = start_worker(env, work / "logs", name=f"capacity-{slots}", concurrency=slots)
    except Exception:
        server.stop()
        raise
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    pool = Stack(f"capacity-{slots}", settings, server, worker, create_app(settings), client)
    try:
        pool.batch(repo, base, _ids(pool.name, slots), 180.0)
    except BaseException:
        pool.stop()
        raise
    return pool


def _ids(pool: str, count: int) -> list[str]:
    return [f"{pool}-{uuid.uuid4().hex[:10]}" for _ in range(count)]


def _pools(ctx: Context, stack: contextlib.ExitStack, repo: Path, base: str) -> list[Stack]:
    """A warm pool for every S, all started at once: their start-ups overlap, their runs
    do not (the others sit idle meanwhile). ``stack`` stops them, all at once too."""
    with ThreadPoolExecutor(len(SLOTS)) as starting:
        futures = [starting.submit(_warm_pool, ctx, slots, repo, base) for slots in SLOTS]
    started = [f.result() for f in futures if f.exception() is None]
    stack.callback(_stop_all, started)
    return [f.result() for f in futures]  # the first failure, once the rest will be stopped


def _stop_all(pools: list[Stack]) -> None:
    with ThreadPoolExecutor(len(pools) or 1) as stopping:
        list(stopping.map(Stack.stop, pools))


def _batches(pool: Stack, repo: Path, base: str, reps: int, jobs: int) -> Side:
    """``reps`` batches of ``jobs`` on ``pool``, and the CPU its processes spent on them."""

    def batch() -> Run:
        return pool.batch(repo, base, _ids(pool.name, jobs), 60.0 + 10.0 * jobs)

    spent, runs = NOTHING, list[Run]()
    for _ in range(reps):
        run, used = metered(batch, lambda: proc_cpu_s(pool.server.pid),
                            lambda: tree_cpu_s(pool.worker.pid))  # fmt: skip
        spent, runs = spent + used, [*runs, run]
    return spent.side(runs, "worker")


def job_curve(ctx: Context) -> tuple[list[Figure], Curve, str]:
    reps, waves = ctx.pick(1, 2), ctx.pick(2, 4)
    repo = ctx.dir("capacity/jobs") / "repo"
    base = make_repo(repo, repo_files())
    sides: dict[int, Side] = {}
    figures, curve = [], Curve("jobs/s", "S")
    ctx.log(f"capacity: starting pools of {', '.join(map(str, SLOTS))} slots")
    with contextlib.ExitStack() as stack:
        pools = _pools(ctx, stack, repo, base)
        for slots, pool in zip(SLOTS, pools, strict=True):
            jobs = waves * slots
            ctx.log(f"capacity: {slots} slot(s), {reps} batch(es) of {jobs} jobs")
            sides[slots] = _batches(pool, repo, base, reps, jobs)
    for slots, side in sides.items():
        one = curve.series["pool"][0][1]["ops_per_s"] if curve.series else side["ops_per_s"]
        curve.add("pool", slots, side)
        figures.append(Figure(
            name=f"capacity.jobs@S={slots}",
            what=f"S slots, worker concurrency S: batches of {waves} scripted jobs per slot",
            subject_label="a Celery worker (concurrency S) + a tool server, S slots",
            baseline_label="-", unit="jobs/s", subject=side, baseline=None,
            ratio=side["ops_per_s"] / one,
            ratio_means="jobs/s / jobs/s with one slot (the speed-up); p50 is the median job",
        ))  # fmt: skip
    note = (f"jobs: {reps} batch(es) of {waves} jobs per slot per point, after a warm-up "
            "batch of one job per slot; the worker's cores count its pool's children")  # fmt: skip
    return figures, curve, note


# -- the benchmark -----------------------------------------------------------------------


def run(ctx: Context) -> BenchResult:
    result = BenchResult("capacity")
    ncpu = len(os.sched_getaffinity(0))
    calls, by_agents, calls_note = call_curve(ctx)
    jobs, by_slots, jobs_note = job_curve(ctx)
    calls_knee = by_agents.knee_figure("capacity.calls.knee", ncpu, "client")
    jobs_knee = by_slots.knee_figure("capacity.jobs.knee", ncpu, "worker", {"pool": "tool server"})
    result.figures += [*calls, calls_knee, *jobs, jobs_knee]
    result.notes += [
        calls_note,
        jobs_note,
        "cores = CPU seconds over wall seconds of the measured runs: a server from "
        "/proc/<pid>/stat (with the children it reaped), the client from this process "
        "(every agent thread), the worker from its process and its pool's, the host from "
        "/proc/stat (every process on the machine, other users' load included).",
    ]
    if ctx.quick:
        result.notes.append(f"plot: none from a quick run (bench/{PLOT.name} is a full run's)")
    else:
        result.notes.append(f"plot: {write_plot(by_agents, by_slots, PLOT)}")
    return result
