"""A seeded end-to-end fault campaign on the real stack (``slotrunner chaos``).

One run: a plan from the seed (``ops.testing.chaos.plan``) -> a scratch home with its own
Redis, tool server, fault proxy and Celery workers (``ops.testing.chaos.stack``) -> the
jobs are submitted and the faults injected as their calls pass (``ops.testing.chaos.faults``)
-> every job's result is awaited, the slots are left to settle (the janitor swept,
bounded) -> the stack is stopped -> the checks (``ops.testing.chaos.checks``) -> a report
(``ops.testing.chaos.report``). The run passes only when every check does; what the faults
did is in the report either way, and the scratch home (with its log) is kept beside
it for the post-mortem.

``hosts > 1`` runs the same on N hosts sharing the one Redis (``ops.testing.chaos.stack``),
with the whole-host faults among the kinds; the checks then run over every host
(``ops.testing.chaos.hostchecks``) and the report has a row per host.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ops.errors import OpsError
from ops.testing.chaos import checks, hostchecks
from ops.testing.chaos import plan as cp
from ops.testing.chaos.expect import ExpectError, expected_tree
from ops.testing.chaos.faults import Injector
from ops.testing.chaos.report import ChaosReport, write_report
from ops.testing.chaos.stack import DEAD, VISIBILITY_S, ChaosStack, wait_until
from ops.testing.stack import StackError
from runner.core.git import git_text, run_git
from runner.core.poll import PollTimeout, poll_until
from runner.jobs import result_copy
from runner.jobs.models import JobResult
from runner.jobs.results import load_result
from runner.jobs.submit import submit

HOME_MARK = ".chaos-home"  # only a directory carrying this is ever wiped by a rerun
SETTLE_S = 30.0  # longest wait for the slots to come back after the last result
LEAK_WAIT_S = 15.0
Say = Callable[[str], None]


class ChaosError(OpsError):
    """The campaign could not run (a bad report dir, a stack that did not start)."""


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    jobs: int
    report_dir: Path
    workers: int = 2  # per host
    slots: int = 4  # per host
    kinds: tuple[str, ...] = cp.KINDS
    hosts: int = 1
    timeout_s: float | None = None  # for all results; default 120 s + 20 s a job
    # Test only: False starts the tool server with the envelope check off (the control
    # run that shows the checks catch a replayed old envelope that lands).
    fence: bool = True
    # Test only: False starts the workers without the attempt floor (the control run
    # that shows the attempt check catches the numbers a Redis wipe reissues).
    attempt_floor: bool = True


def run_campaign(config: ChaosConfig, say: Say = lambda _: None) -> ChaosReport:
    plan = cp.make_plan(
        config.seed, config.jobs, config.kinds, visibility_s=VISIBILITY_S, hosts=config.hosts
    )
    home = _fresh_home(config.report_dir)
    repo = config.report_dir / "repo"
    base = _make_repo(repo)
    started = time.monotonic()
    try:
        stack = ChaosStack(
            home,
            host=f"chaos-{config.seed}",
            slots=config.slots,
            workers=config.workers,
            fence=config.fence,
            attempt_floor=config.attempt_floor,
            hosts=config.hosts,
        )
    except Exception as exc:
        raise ChaosError(f"the embedded Redis did not start: {exc}") from exc
    injector = Injector(plan, stack, started)
    results: dict[str, JobResult] = {}
    specs = {job.job_id: _spec(job, repo, base, config.seed) for job in plan.jobs}
    collect = _Collector(stack, injector, plan, results, say)
    injector.on_wipe = partial(_wipe, stack, specs, collect, say)
    try:
        try:
            stack.start()
        except StackError as exc:
            raise ChaosError(str(exc)) from exc
        say(f"stack up in {time.monotonic() - started:.1f}s; submitting {len(plan.jobs)} jobs")
        injector.arm()
        for job in plan.jobs:
            submit(stack.app, stack.redis, specs[job.job_id])
            injector.before_start(job.job_id)
        timeout_s = config.timeout_s or 120.0 + 20.0 * len(plan.jobs)
        _await(stack, collect, plan, results, timeout_s)
        injector.all_finished.set()
        injector.settle()
        _settle_slots(stack)
    finally:
        stack.stop()
    duration_s = time.monotonic() - started
    leftover = wait_until(lambda: not checks.scan_processes(home), LEAK_WAIT_S)
    found = [] if leftover else checks.scan_processes(home)
    say("stack stopped; checking")
    report = _report(config, plan, stack, injector, results, found, repo, base, duration_s)
    write_report(report, config.report_dir)
    return report


class _Collector:
    """Move committed results from Redis into the campaign's own record, once each.

    Called from the await loop and, just before a Redis wipe, from the proxy thread
    running that fault: what the campaign holds survives the wipe, what Redis held
    does not.
    """

    def __init__(
        self,
        stack: ChaosStack,
        injector: Injector,
        plan: cp.Plan,
        results: dict[str, JobResult],
        say: Say,
    ) -> None:
        self.stack, self.injector, self.plan = stack, injector, plan
        self.results, self.say = results, say
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.collect_locked()

    def collect_locked(self) -> None:
        for job in self.plan.jobs:
            if job.job_id in self.results:
                continue
            found = load_result(self.stack.redis, job.job_id)
            if found is not None:
                self.results[job.job_id] = found
                self.injector.job_finished(job.job_id)
                self.say(f"{len(self.results)}/{len(self.plan.jobs)} {job.job_id} {found.state}")


def _wipe(
    stack: ChaosStack,
    specs: Mapping[str, dict[str, Any]],
    collect: _Collector,
    say: Say,
    restart: Callable[[], None],
) -> None:
    """Collect, ``restart`` Redis empty, then recover as an operator would: every host's
    kept results back into Redis (``slotrunner republish``), and every job that still
    has no result submitted again.

    The queue, the specs and the results are gone; a job still running in a worker
    is fenced by the empty attempt counter at its next step (its number is never
    reissued: the host's attempt floor), so resubmitting it starts the next attempt.
    A job committed between the collection and the restart is in no record of the
    campaign's, only in its host's kept copy: without the republish, a resubmission
    that reaches another host would run it a second time (three-host seed 7).
    The collector's lock is held throughout, so the await loop never reads the
    server while it is down.
    """
    with collect.lock:
        collect.collect_locked()
        restart()
        for host in stack.hosts:
            done = result_copy.republish_all(stack.redis, host.home)
            if done.put_back or done.unusable:
                say(
                    f"{host.name}: put back {len(done.put_back)} kept result(s)"
                    f"{f', unreadable: {sorted(done.unusable)}' if done.unusable else ''}"
                )
        collect.collect_locked()
        missing = [job_id for job_id in specs if job_id not in collect.results]
        for job_id in missing:
            submit(stack.app, stack.redis, specs[job_id])
    say(f"Redis restarted empty: resubmitted {len(missing)} jobs without a result")


def _await(
    stack: ChaosStack,
    collect: _Collector,
    plan: cp.Plan,
    results: dict[str, JobResult],
    timeout_s: float,
) -> None:

    def finished() -> bool:
        collect()
        # A tool server gone for good (restart_errors) finishes nothing more.
        return len(results) >= len(plan.jobs) or bool(stack.restart_errors)

    with contextlib.suppress(PollTimeout):  # the checks then name what did not finish
        poll_until(finished, timeout_s, 0.2)


def _settle_slots(stack: ChaosStack) -> None:
    """Sweep until every slot is idle or poisoned (dead attempts' slots reclaimed), on
    every host but one dead for good: nothing of it runs to sweep its slots."""
    from runner.core.logs import EventLog
    from runner.slots.janitor import Janitor
    from runner.slots.pool import SlotPool

    janitors = []
    for host in stack.hosts:
        if host.state == DEAD:
            continue
        settings = host.settings
        log = EventLog(settings)
        pool = SlotPool(settings, stack.redis, log)
        janitors.append((settings, Janitor(settings, stack.redis, log, pool)))

    def settled() -> bool:
        for _, janitor in janitors:
            janitor.sweep(lock_timeout_s=1.0)
        return all(checks.slots_settled(settings).ok for settings, _ in janitors)

    wait_until(settled, SETTLE_S, poll_s=0.5)


def _report(
    config: ChaosConfig,
    plan: cp.Plan,
    stack: ChaosStack,
    injector: Injector,
    results: dict[str, JobResult],
    found: list[str],
    repo: Path,
    base: str,
    duration_s: float,
) -> ChaosReport:
    events = stack.events()
    env = {**stack.env, "SLOTRUNNER_HOME": str(stack.home)}
    logs = [h.settings.log_path for h in stack.hosts]
    verify = checks.ops_tool("verify", logs, env)
    detect = checks.ops_tool("detect", logs, env)
    expected, notes = {}, []
    for job in plan.jobs:
        result = results.get(job.job_id)
        if result is not None and result.state == "succeeded":
            try:
                expected[job.job_id] = expected_tree(repo, base, job.steps, stack.settings)
            except ExpectError as exc:
                notes.append(f"{job.job_id}: {exc}")
    duplicates = max(
        int(verify.data.get("counts", {}).get("duplicate_apply", 0)),
        int(detect.data.get("counts", {}).get("duplicate_apply", 0)),
    )
    notes.append(
        "admission desk: not used (scripted planners make no inference requests); its "
        "recovery after a Redis wipe is tested in tests/runner/admission/test_recovery.py"
    )
    notes += [f"worker restarted after it exited: {why}" for why in stack.worker_restarts]
    if len(stack.hosts) > 1:
        host_checks = hostchecks.host_checks(stack, injector, results, events, verify, detect, env)
        per_host = [hostchecks.host_row(h, injector) for h in stack.hosts]
    else:
        fsync_slots = {slot for _, slot in injector.fsync_slots}
        host_checks, per_host = checks.slot_checks(stack.settings, events, fsync_slots), []
    return ChaosReport(
        seed=config.seed,
        jobs=len(plan.jobs),
        workers=config.workers,
        kinds=[k for k in cp.ALL_KINDS if k in config.kinds],
        planned=[{**f.__dict__, "job_id": plan.jobs[f.job].job_id} for f in plan.faults],
        fired=[f.to_json() for f in injector.fired],
        states=dict(Counter(r.state for r in results.values())),
        checks=[
            verify,
            detect,
            checks.terminal_states([j.job_id for j in plan.jobs], results),
            checks.one_commit(events),
            checks.attempts_never_repeat(events),
            *host_checks[:4],
            checks.final_trees(results, expected),
            checks.replays_refused(injector.replays),
            checks.supervisor(len(stack.restarts), stack.restart_errors),
            checks.leaks(found),
            checks.exec_orphans(
                [h.settings for h in stack.hosts],
                [plan.jobs[f.job].job_id for f in plan.faults if f.kind == cp.EXEC_ORPHAN],
                sum(1 for f in injector.fired if f.kind == cp.EXEC_ORPHAN and not f.skipped),
            ),
            *host_checks[4:],
            *(
                checks.receipts_i2(
                    h.home,
                    h.settings.log_path,
                    env,
                    f"receipts_i2@{h.name}" if len(stack.hosts) > 1 else "receipts_i2",
                )
                for h in stack.hosts
            ),
        ],
        duplicate_applies=duplicates,
        duration_s=duration_s,
        report_dir=str(config.report_dir),
        toolserver_restarts=len(stack.restarts),
        worker_restarts=list(stack.worker_restarts),
        notes=notes,
        hosts=per_host,
    )


def _spec(job: cp.JobPlan, repo: Path, base: str, seed: int) -> dict[str, Any]:
    import sys

    return {
        "job_id": job.job_id,
        "eval_run": f"chaos-{seed}",
        "repo": str(repo),
        "base": base,
        "test_command": job.test_command(sys.executable),
        "test_timeout_s": 60,
        "deadline_s": 900,
        "planner": {"kind": "scripted", "steps": list(job.steps)},
    }


def _fresh_home(report_dir: Path) -> Path:
    home = report_dir / "home"
    if home.exists():
        if not (home / HOME_MARK).is_file():
            raise ChaosError(f"{home} exists and is not a chaos scratch home: not touching it")
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / HOME_MARK).write_text("scratch home of a slotrunner chaos run; wiped by the next\n")
    return home


def _make_repo(path: Path) -> str:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    for name, content in cp.BASE_FILES.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        run_git(*argv, cwd=path, check=True)
    return git_text("rev-parse", "HEAD", cwd=path)
