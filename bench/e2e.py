"""Scripted agent jobs end to end on a real pool, and what its layers cost.

Each job makes 10 tool calls (2 read_file, 3 write_file, 2 apply_patch, 2 git_status,
1 run_tests of ``/bin/true`` in the sandbox) on a 200-file repository. Three arms,
interleaved, each running the same batch of jobs two at a time (2 slots, 2 lanes):

- **pool**: a real Celery worker (prefork, concurrency 2) and a real tool server, jobs
  enqueued through ``runner.jobs.submit``: attempt fence, slot lease, worktree prepare
  and start snapshot, the agent loop over HTTP, end snapshot, diff, release, result;
- **pool, fence off**: the same, the tool server started as the test server
  ``python -m ops.testing.toolserver --fence off`` (the envelope check lets every
  call through; see ``tools/server/seams.py``);
- **in-process**: no Celery, no HTTP, no slot pool: two threads, each with a plain
  clone, reset per job (``git checkout -f`` + ``reset --hard`` + ``clean -ffdx``), then
  the same 10 calls straight into ``tools.builtin`` with ``ReceiptStore`` begin/finish
  around each mutating one.

A job's time is ``job_started`` -> ``job_finished`` in the pool's event log (the
in-process arm times its own jobs); jobs/s is the batch over the wall time from the
first submit to the last ``job_finished``.

A fourth arm, a second fence-on pool identical to the first, is the A/A control: the
difference two identical pools show on this machine is the noise floor under the
isolation figure.

Goal: isolation overhead (pool vs pool with the fence off) at most 15 % of
end-to-end job time (the median job time over all repetitions). The orchestration
overhead (pool vs in-process) is reported.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import redis
from celery import Celery

from bench.e2e_job import LANES, STEPS, job_spec, repo_files
from bench.fixtures import Context, child_env, make_repo, settings_for, toolserver
from bench.inprocess import InProcess
from bench.machine import tree_hwm_mb, vm_hwm_mb
from bench.stats import (
    BenchError,
    BenchResult,
    Figure,
    Goal,
    Run,
    interleave,
    paired,
    summarize,
)
from ops.testing.stack import Child, start_worker
from runner.core import events
from runner.core.poll import poll_until
from runner.core.settings import Settings
from runner.jobs.submit import submit, wait_for
from runner.worker.celery_app import create_app

GOAL = Goal("<=", 15.0, "isolation overhead <= 15 % of end-to-end job time")


def instant(ts: str) -> float:
    """A log record's ``ts`` as epoch seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass
class Stack:
    """A tool server and a Celery worker sharing one home and one Redis database."""

    name: str
    settings: Settings
    server: Child
    worker: Child
    app: Celery
    redis: redis.Redis

    @classmethod
    def start(cls, ctx: Context, name: str, db: int, fence: bool) -> Stack:
        work = ctx.dir(f"e2e/{name}")
        settings = settings_for(work / "home", ctx.redis_db(db), slots=LANES, name=f"e2e-{name}")
        settings, server = toolserver(settings, work / "logs", fence=fence)
        try:
            worker = start_worker(
                child_env(settings), work / "logs", name=f"bench-{name}", concurrency=LANES
            )
        except Exception:
            server.stop()
            raise
        client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
        return cls(name, settings, server, worker, create_app(settings), client)

    def stop(self) -> None:
        self.redis.close()
        self.worker.stop()
        self.server.stop()

    def batch(self, repo: Path, base: str, job_ids: list[str], timeout_s: float) -> Run:
        started = time.time()
        for job_id in job_ids:
            submit(self.app, self.redis, job_spec(repo, base, job_id))
        results = wait_for(self.redis, job_ids, timeout_s, poll_s=0.05)
        for job_id in job_ids:
            got = results.get(job_id)
            if got is None or got.state != "succeeded":
                state = "did not finish" if got is None else f"ended {got.state}: {got.reason}"
                raise BenchError(f"e2e {self.name}: job {job_id} {state}\n{self.worker.tail(15)}")
            if got.counts.tool_calls != len(STEPS):
                raise BenchError(
                    f"e2e {self.name}: job {job_id} made {got.counts.tool_calls} calls"
                )
        # ``job_finished`` is logged just after the commit that made the result visible:
        # read the log until every job's line is there.
        begun, ended = poll_until(
            lambda: self._times(job_ids), 30.0, 0.05, what="every job's job_finished line"
        )
        durations = tuple(ended[j] - begun[j] for j in job_ids)
        return Run(durations, max(ended.values()) - started, len(job_ids))

    def _times(self, job_ids: list[str]) -> tuple[dict[str, float], dict[str, float]] | None:
        """(started, finished) instants by job, once the log has both for every job."""
        begun: dict[str, float] = {}
        ended: dict[str, float] = {}
        wanted = set(job_ids)
        with open(self.settings.log_path, "rb") as log:
            for raw in log:
                line = json.loads(raw)
                if line.get("job_id") not in wanted:
                    continue
                if line["event"] == events.JOB_STARTED:
                    begun[line["job_id"]] = instant(line["ts"])
                elif line["event"] == events.JOB_FINISHED:
                    ended[line["job_id"]] = instant(line["ts"])
        return (begun, ended) if wanted <= begun.keys() & ended.keys() else None


def run(ctx: Context) -> BenchResult:
    result = BenchResult("e2e")
    reps, jobs = ctx.pick(2, 8), ctx.pick(4, 12)
    timeout_s = 60.0 + 15.0 * jobs
    repo = ctx.dir("e2e") / "repo"
    base = make_repo(repo, repo_files())
    with contextlib.ExitStack() as stack:
        ctx.log("e2e: starting three pools (fence on, its twin, fence off)")
        on = Stack.start(ctx, "fence-on", 1, fence=True)
        stack.callback(on.stop)
        twin = Stack.start(ctx, "fence-on-twin", 3, fence=True)
        stack.callback(twin.stop)
        off = Stack.start(ctx, "fence-off", 2, fence=False)
        stack.callback(off.stop)
        inproc = InProcess(ctx, repo, base, on.settings.sandbox)
        made = 0

        def ids(arm: str, count: int) -> list[str]:
            nonlocal made
            made += 1
            return [f"e2e-{arm}-{made}-{k}-{uuid.uuid4().hex[:6]}" for k in range(count)]

        # Warm-up: worker children forked, caches cloned, worktrees added.
        for pool in (on, twin, off):
            pool.batch(repo, base, ids(pool.name, LANES), 120.0 + timeout_s)
        inproc.batch(ids("in", LANES))
        runs = interleave(
            reps,
            {
                "pool": lambda _: on.batch(repo, base, ids("on", jobs), timeout_s),
                "fence_off": lambda _: off.batch(repo, base, ids("off", jobs), timeout_s),
                "inproc": lambda _: inproc.batch(ids("in", jobs)),
                "twin": lambda _: twin.batch(repo, base, ids("twin", jobs), timeout_s),
            },
        )
        _memory(ctx, on)
    what = f"{jobs} jobs of {len(STEPS)} calls, {LANES} at a time"
    pool_label = "Celery worker + tool server, envelope hook on"
    result.figures += [
        _overhead(
            "e2e.isolation", f"{what}: fence on vs off", runs["pool"], runs["fence_off"],
            pool_label, "an identical pool, its tool server with --fence off", GOAL,
        ),
        _overhead(
            "e2e.control", f"{what}: two identical fence-on pools (A/A: the noise floor)",
            runs["pool"], runs["twin"], pool_label, "a second, identical fence-on pool", None,
        ),
    ]  # fmt: skip
    _, o_low, o_high = paired(runs["pool"], runs["inproc"], lambda s, b: _job(s) / _job(b))
    orch = _pooled(runs["pool"]) / _pooled(runs["inproc"])
    result.figures.append(
        Figure(
            name="e2e.orchestration",
            what=f"{what}: pool vs in-process",
            subject_label="Celery worker + tool server (HTTP, lease, prepare, snapshots)",
            baseline_label="threads calling tools.builtin + ReceiptStore (clone reset per job)",
            unit="jobs/s",
            subject=summarize(runs["pool"]),
            baseline=summarize(runs["inproc"]),
            ratio=orch,
            ratio_means="pool median job time / in-process median job time, all jobs "
            "(no goal: reported; spread per repetition pair)",
            spread=(o_low, o_high),
            value=100.0 * (1.0 - 1.0 / orch),
            value_means="orchestration share of the pool's job time, in %",
        )
    )
    result.notes.append(
        f"{reps} repetitions of {jobs} jobs per arm, interleaved; sandbox mode "
        f"{on.settings.sandbox!r}; python {sys.version.split()[0]}; pool job times from "
        "the pool's own job_started/job_finished log lines. Overheads are judged on the "
        "median job time (the end-to-end job time) over all repetitions; jobs/s (batch "
        "throughput) is shown for reference. Read e2e.isolation against e2e.control: a "
        "difference smaller than the control's is below what this machine can resolve."
    )
    return result


def _job(run: Run) -> float:
    """The repetition's median job time."""
    return statistics.median(run.op_s)


def _pooled(runs: list[Run]) -> float:
    """The median job time over every job of every repetition."""
    return statistics.median(d for run in runs for d in run.op_s)


def _overhead(
    name: str,
    what: str,
    subject: list[Run],
    baseline: list[Run],
    subject_label: str,
    baseline_label: str,
    goal: Goal | None,
) -> Figure:
    # Judged on the median over every job of every repetition (the arms are interleaved,
    # so drift falls on both): a repetition's own median of a few jobs is too noisy on
    # 2 cores. The per-pair shares are still shown, as the spread.
    job_s, base_s = _pooled(subject), _pooled(baseline)
    _, low, high = paired(subject, baseline, lambda s, b: 100.0 * (_job(s) - _job(b)) / _job(s))
    return Figure(
        name=name,
        what=what,
        subject_label=subject_label,
        baseline_label=baseline_label,
        unit="jobs/s",
        subject=summarize(subject),
        baseline=summarize(baseline),
        ratio=job_s / base_s,
        ratio_means="median job time / baseline median job time (all jobs of all repetitions)",
        spread=(low, high),
        goal=goal,
        value=100.0 * (job_s - base_s) / job_s,
        value_means="(median job time - baseline median job time) / median job time, in %",
        note="the spread shown is of that share (%) per repetition pair (each a median of "
        "its own jobs): how far one repetition can stray on this machine",
    )


def _memory(ctx: Context, stack: Stack) -> None:
    server = vm_hwm_mb(stack.server.pid)
    if server is not None:
        ctx.memory["toolserver.e2e"] = (server, "tool server after the e2e pool's jobs")
    total, per = tree_hwm_mb(stack.worker.pid)
    if per:
        detail = " + ".join(f"{p:.0f}" for p in per)
        ctx.memory["worker.e2e"] = (total, f"Celery worker parent + children ({detail} MB)")
        ctx.memory["worker.e2e.processes"] = (float(len(per)), "processes in the worker")
