"""What ``slotrunner demo --real`` reports: each job against its plan, and the environment.

A job's tests come from its last ``run_tests`` result (pytest's own summary line and
its ``FAILED`` lines); whether it built or reused the environment, and how many times
setup ran, from the host's JSONL log (``environment_built`` is logged once per build,
docs/architecture.md §Environments), so "setup ran once" is counted, not assumed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ops.demo.real_jobs import Plan
from runner.core import events
from runner.jobs import events as job_events

_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
# Failure sections' headers ("____ test_x ____"), for output cut before the summary.
_HEADER = re.compile(r"^_{3,} (\S.*?) _{3,}$", re.MULTILINE)


@dataclass
class Tests:
    passed: int = 0
    failed: int = 0
    failing: list[str] = field(default_factory=list)
    ok: bool = False

    def text(self) -> str:
        if self.failed or not self.ok:
            names = ", ".join(self.failing) or "?"
            return f"{self.passed} passed, {self.failed} failed: {names}"
        return f"{self.passed} passed"


def tests_of(result: Any) -> Tests | None:
    """The last ``run_tests`` step's counts and failing tests; None if none ran."""
    runs = [s for s in result.steps if s.tool == "run_tests" and s.result is not None]
    if not runs:
        return None
    reply = runs[-1].result
    stdout = str(reply.get("stdout", ""))
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(stdout):
        counts["failed" if word.startswith("error") else word] = int(number)
    failing = _FAILED_LINE.findall(stdout) or _HEADER.findall(stdout)
    return Tests(
        passed=counts.get("passed", 0),
        failed=counts.get("failed", len(failing)),
        failing=failing,
        ok=bool(reply.get("passed")),
    )


@dataclass
class Outcome:
    """One job: what it ended as, and whether that is what its plan expects."""

    job_id: str
    plan: Plan
    state: str
    reason: str | None
    environment: dict[str, Any] | None
    tests: Tests | None
    seconds: float | None
    problems: list[str]

    @property
    def expected(self) -> bool:
        return not self.problems


def judge(plan: Plan, job_id: str, result: Any, seconds: float | None) -> Outcome:
    problems: list[str] = []
    if result is None:
        return Outcome(job_id, plan, "unfinished", None, None, None, seconds, ["did not finish"])
    tests = tests_of(result)
    if result.state != plan.state:
        problems.append(f"ended {result.state}, expected {plan.state}")
    if result.environment is None:
        problems.append("has no environment")
    if tests is None:
        problems.append("ran no tests")
    elif plan.failing and sorted(tests.failing) != sorted(plan.failing):
        problems.append(f"failing tests {tests.failing or 'none'}, expected {list(plan.failing)}")
    elif not plan.failing and not tests.ok:
        problems.append("its tests failed")
    return Outcome(
        job_id, plan, result.state, result.reason, result.environment, tests, seconds, problems
    )


def read_log(log_path: Path, job_ids: set[str]) -> list[dict[str, Any]]:
    """The host log's records about these jobs."""
    records = []
    try:
        with open(log_path, "rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("job_id") in job_ids:
                    records.append(record)
    except FileNotFoundError:
        pass
    return records


def job_seconds(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """Each job's ``job_started`` -> ``job_finished`` seconds; None until every job has both."""
    started: dict[str, datetime] = {}
    finished: dict[str, datetime] = {}
    for record in records:
        if record.get("event") == events.JOB_STARTED:
            started[record["job_id"]] = datetime.fromisoformat(record["ts"])
        elif record.get("event") == events.JOB_FINISHED:
            finished[record["job_id"]] = datetime.fromisoformat(record["ts"])
    wanted = {r["job_id"] for r in records}
    if not wanted or not wanted <= started.keys() & finished.keys():
        return None
    return {j: (finished[j] - started[j]).total_seconds() for j in wanted}


@dataclass
class EnvReport:
    """The shared environment across the run: its keys and how often setup ran."""

    keys: list[str]
    builds: list[dict[str, Any]]  # the environment_built records
    reused: int
    problems: list[str]


def env_report(outcomes: list[Outcome], records: list[dict[str, Any]]) -> EnvReport:
    keys = sorted({o.environment["key"] for o in outcomes if o.environment is not None})
    builds = [r for r in records if r.get("event") == job_events.ENVIRONMENT_BUILT]
    reused = sum(1 for r in records if r.get("event") == job_events.ENVIRONMENT_REUSED)
    problems = []
    if len(keys) != 1:
        problems.append(f"the jobs used {len(keys)} environments, expected one")
    if len(builds) != 1:
        problems.append(f"setup ran {len(builds)} times, expected once")
    return EnvReport(keys, builds, reused, problems)


def _times(n: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")


def render(console: Console, outcomes: list[Outcome], env: EnvReport, log_path: Path) -> None:
    table = Table("job", "plan", "state", "environment", "tests", "time", "as expected")
    for column in table.columns:
        column.no_wrap = True
    for o in outcomes:
        environment = "-"
        if o.environment is not None:
            if o.environment.get("built"):
                environment = f"built ({o.environment.get('build_s', 0):.1f} s)"
            elif o.environment.get("wait_s", 0) >= 0.05:
                environment = f"reused (waited {o.environment['wait_s']:.1f} s)"
            else:
                environment = "reused"
        table.add_row(
            o.job_id,
            o.plan.name,
            o.state,
            environment,
            o.tests.text() if o.tests is not None else "not run",
            f"{o.seconds:.1f} s" if o.seconds is not None else "-",
            "yes" if o.expected else "NO",
        )
    console.print(table)
    for o in outcomes:
        console.print(f"{o.job_id} ({o.plan.name}): {o.plan.what}", markup=False)
        for problem in o.problems:
            console.print(f"  unexpected: {problem}; reason: {o.reason}", markup=False)
    if env.keys:
        build = env.builds[0] if env.builds else {}
        built = f"built in {build['build_s']:.1f} s by {build['job_id']}, " if build else ""
        console.print(
            f"environment {', '.join(env.keys)}: {built}reused by {env.reused} "
            f"job{'s' if env.reused != 1 else ''}; setup ran {_times(len(env.builds))}",
            markup=False,
        )
        if build.get("log"):
            console.print(f"environment build log: {build['log']}", markup=False)
    for problem in env.problems:
        console.print(f"unexpected: {problem}", markup=False)
    good = sum(o.expected for o in outcomes)
    console.print(f"jobs as expected: {good} of {len(outcomes)}")
    console.print(f"log: {log_path}", markup=False)
