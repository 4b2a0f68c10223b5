"""A job with a warm environment against the same job with a cold one (#14).

The job runs a real project's own tests: ``six`` 1.17.0 (its sdist from the package
index, committed into a local repository; ``ops/demo/six_source.py``), one
``run_tests`` step of ``python -m pytest -q test_six.py`` in the job's environment,
set up as ``python3 -m venv $ENV`` + ``$ENV/bin/pip install -q pytest``
(docs/architecture.md §Environments). A real Celery worker (one process) and a real
tool server, the sandbox required, one slot. Every repetition commits a new base
first, for both arms alike (the slot fetches it, the environment is keyed on it):

- **cold** (subject): the environment is keyed on the base's tree, so each new base
  has a new key: the job checks the base out, runs the setup (pip reaches the package
  index every time: no cache is shown to the sandbox) and then its tests;
- **warm** (baseline): ``key_files: ["setup.py"]``, which no commit changes: the key
  was built by a warm-up job, and each job takes it (a lock, a ``meta.json`` read, a
  hold) before its tests.

A job's time is ``job_started`` -> ``job_finished`` in the worker's event log; the
arms alternate (cold, warm, warm, cold, ...). No goal: the ratio (cold median job
time / warm median job time) says what building an environment once per key saves
each later job on it.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from typing import Any

import redis

from bench.e2e import instant
from bench.fixtures import Context, child_env, settings_for, toolserver
from bench.stats import (
    BenchError,
    BenchResult,
    Figure,
    Run,
    interleave,
    not_measured,
    paired,
    summarize,
)
from ops.demo.sample_repo import commit_files, init_repo
from ops.demo.six_source import RealDemoError, download, extract
from ops.testing.stack import Child, start_worker
from runner.core import events
from runner.core.poll import poll_until
from runner.core.settings import Settings
from runner.jobs.submit import submit, wait_for
from runner.worker.celery_app import create_app
from tools.sandbox import run as sandbox

NAME = "envs.cold_vs_warm"
WHAT = "one job running six's test suite: its environment built first (cold) vs already built"
SETUP = [["python3", "-m", "venv", "$ENV"], ["$ENV/bin/pip", "install", "-q", "pytest"]]
TEST_COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_six.py"]
KEY_FILES = ["setup.py"]
_DB = 4  # a database of its own: its worker must not take another benchmark's jobs
_JOB_TIMEOUT_S = 600.0


class Pool:
    """A tool server and a one-process Celery worker on one home, and the job repo."""

    def __init__(self, ctx: Context, stack: contextlib.ExitStack) -> None:
        work = ctx.dir("envs")
        try:
            sdist = download(work / "sdist")
            self.repo = work / "six"
            extract(sdist, self.repo)
        except RealDemoError as exc:
            raise BenchError(str(exc)) from None
        self.base = init_repo(self.repo, {}, "six, as released")
        settings = settings_for(
            work / "home", ctx.redis_db(_DB), slots=1, sandbox="required", name="envs"
        )
        self.settings: Settings
        self.settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        self.worker: Child = start_worker(
            child_env(self.settings), work / "logs", name="bench-envs", concurrency=1
        )
        stack.callback(self.worker.stop)
        self.redis = redis.Redis.from_url(self.settings.redis_url or "", decode_responses=True)
        stack.callback(self.redis.close)
        self.app = create_app(self.settings)
        self.made = 0
        self.build_s: list[float] = []

    def job(self, arm: str, *, cold: bool, builds: bool) -> Run:
        """One job on a new base, keyed on its tree (``cold``) or on ``setup.py``;
        ``builds``: whether it must find its environment to build. Its time from the log."""
        self.made += 1
        job_id = f"envs-{arm}-{self.made}"
        base = commit_files(self.repo, {"BENCH.txt": f"{job_id}\n"}, job_id)
        environment: dict[str, Any] = {"setup": SETUP}
        if not cold:
            environment["key_files"] = KEY_FILES
        spec = {
            "job_id": job_id,
            "eval_run": "bench-envs",
            "repo": str(self.repo),
            "base": base,
            "test_command": TEST_COMMAND,
            "planner": {"kind": "scripted", "steps": [{"tool": "run_tests", "args": {}}]},
            "environment": environment,
        }
        submit(self.app, self.redis, spec)
        got = wait_for(self.redis, [job_id], _JOB_TIMEOUT_S, poll_s=0.05).get(job_id)
        if got is None or got.state != "succeeded":
            state = "did not finish" if got is None else f"ended {got.state}: {got.reason}"
            raise BenchError(f"envs: job {job_id} {state}\n{self.worker.tail(15)}")
        built = (got.environment or {}).get("built")
        if built is not builds:
            raise BenchError(f"envs: {arm} job {job_id} had environment {got.environment}")
        if built and cold:
            self.build_s.append(float((got.environment or {}).get("build_s") or 0.0))
        begun, ended = poll_until(
            lambda: self._times(job_id), 30.0, 0.05, what=f"{job_id}'s job_finished line"
        )
        return Run((ended - begun,), ended - begun, 1)

    def _times(self, job_id: str) -> tuple[float, float] | None:
        begun = ended = None
        with open(self.settings.log_path, "rb") as log:
            for raw in log:
                line = json.loads(raw)
                if line.get("job_id") != job_id:
                    continue
                if line["event"] == events.JOB_STARTED:
                    begun = instant(line["ts"])
                elif line["event"] == events.JOB_FINISHED:
                    ended = instant(line["ts"])
        return (begun, ended) if begun is not None and ended is not None else None


def run(ctx: Context) -> BenchResult:
    result = BenchResult("envs")
    test = sandbox.self_test()
    if not test.ok:
        result.figures.append(not_measured(NAME, WHAT, test.detail))
        return result
    reps = ctx.pick(2, 5)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        pool = Pool(ctx, stack)
        ctx.log(f"envs: six fetched, pool up in {time.monotonic() - started:.0f}s; warm-up job")
        pool.job("warm-up", cold=False, builds=True)  # builds the key every warm job takes
        runs = interleave(
            reps,
            {
                "cold": lambda _: pool.job("cold", cold=True, builds=True),
                "warm": lambda _: pool.job("warm", cold=False, builds=False),
            },
        )
    cold, warm = _median(runs["cold"]), _median(runs["warm"])
    _, low, high = paired(runs["cold"], runs["warm"], lambda c, w: c.op_s[0] / w.op_s[0])
    result.figures.append(
        Figure(
            name=NAME,
            what=WHAT,
            subject_label="cold: a new key, venv + pip install pytest, then the tests",
            baseline_label="warm: the key already built (key_files), the tests",
            unit="jobs/s",
            subject=summarize(runs["cold"]),
            baseline=summarize(runs["warm"]),
            ratio=cold / warm,
            ratio_means="cold median job time / warm median job time (no goal: reported)",
            spread=(low, high),
            value=100.0 * (cold - warm) / cold,
            value_means="share of a cold job's time a warm environment saves, in %",
        )
    )
    result.notes.append(
        f"{reps} repetitions of one job per arm, alternating; median job time cold "
        f"{cold:.2f} s, warm {warm:.2f} s; the cold builds' own build_s (median) "
        f"{statistics.median(pool.build_s):.2f} s; each cold build downloads pytest from "
        "the package index, so its time includes the network's."
    )
    return result


def _median(runs: list[Run]) -> float:
    return statistics.median(d for run in runs for d in run.op_s)
