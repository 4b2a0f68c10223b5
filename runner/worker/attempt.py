"""One attempt of a job, once it holds the job's attempt number and heartbeat.

not cancelled, enough deadline left (``runner.jobs.backpressure``) -> janitor sweep ->
lease a slot (bounded wait; the janitor sweeps while it waits) -> prepare the tree
(start snapshot) -> the job's environment, built or found and held
(``runner.worker.environment``) -> agent loop (asks :meth:`Attempt.between_steps` before each step:
renew the lease, stop when superseded or cancelled) -> end snapshot -> release the
slot (exactly once, in ``finally``) -> commit the result, refused unless this
attempt is still the job's current one.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from runner.agent.api import Workspace
from runner.agent.command import AgentAccess
from runner.agent.function import run_function
from runner.agent.loop import AgentRun, ScriptedSteps
from runner.agent.planners import ChatPlanner, PlannerError, PlannerStopped, admission_desk
from runner.core import keys
from runner.core.stamp import Stamp
from runner.envs.build import Ready
from runner.envs.store import EnvError
from runner.gateway.credentials import Credential
from runner.jobs import backpressure, entry
from runner.jobs import events as job_events
from runner.jobs.models import (
    CommandPlanner,
    JobResult,
    JobSpec,
    PythonPlanner,
    ScriptedPlanner,
    StepRecord,
)
from runner.jobs.results import finish
from runner.slots.fence import LeaseLostError, fenced
from runner.slots.lease_keeper import LeaseKeeper
from runner.slots.pool import Lease, NoSlotFree, ReleaseRefused
from runner.worker import agents, environment
from runner.worker.context import WorkerContext
from runner.worker.liveness import CANCELLED, SUPERSEDED, Claimed, Heartbeat, Liveness
from runner.workspace.git import WorkspaceError
from tools.builtin import write_job

# Between steps the slot lock is free but for a janitor's glance: wait this long for it.
_STEP_RENEW_LOCK_S = 5.0
# While waiting for a slot, sweep for stale ones this often.
_WAIT_SWEEP_S = 1.0
# The attempt's slot was taken back under it (its lease expired while it was silent).
LEASE_LOST = "lease_lost"


class _Stopped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Attempt:
    """The steps of the module docstring for one claimed attempt (built by ``run_job``)."""

    def __init__(
        self,
        spec: JobSpec,
        ctx: WorkerContext,
        liveness: Liveness,
        beat: Heartbeat,
        keeper: LeaseKeeper,
        claimed: Claimed,
    ) -> None:
        assert spec.job_id is not None
        self.spec = spec
        self.job_id = spec.job_id
        self.ctx = ctx
        self.liveness = liveness
        self.beat = beat
        self.keeper = keeper
        self.attempt = claimed.attempt
        self.submitted_at = claimed.submitted_at
        # The slot's lease once taken: its token and MCP URL are what an agent outside
        # this process is handed (docs/architecture.md §Lease tokens).
        self.lease: Lease | None = None
        # A ``python`` planner's function, loaded before any slot is leased.
        self.agent_fn: Any = None
        # The agent's gateway credential, with a ``model`` block (runner.worker.agents).
        self.credential: Credential | None = None
        # A ``command`` agent's process as the result reports it (``JobResult.agent``).
        self.agent_summary: dict[str, Any] | None = None
        # The job's built environment, held from its build until the slot's release.
        self.env: Ready | None = None

    def stop_reason(self) -> str | None:
        if self.beat.superseded.is_set():
            return SUPERSEDED
        if self.keeper.lost.is_set():
            return LEASE_LOST
        return self.liveness.stop_reason(self.attempt)

    def result(self, state: str, reason: str | None = None, **extra: Any) -> JobResult:
        return JobResult.model_validate(
            {"job_id": self.job_id, "attempt": self.attempt, "state": state, "reason": reason}
            | extra
        )

    def run(self) -> JobResult:
        config = self.ctx.config
        stop = self.stop_reason()
        if stop == CANCELLED:
            return self.finish(self.result("cancelled", "cancelled before it started"))
        if stop == SUPERSEDED:
            return self.superseded(self.result("failed", "superseded before it started"))
        if isinstance(self.spec.planner, PythonPlanner):
            try:
                self.agent_fn = entry.load(self.spec.planner.entry)
            except entry.EntryError as exc:
                return self.finish(self.result("rejected", str(exc)))
        if isinstance(self.spec.planner, CommandPlanner):
            problem = agents.command_problem(self.ctx, self.spec, self.attempt)
            if problem is not None:
                return self.finish(self.result("rejected", problem))
        left_s = backpressure.deadline_left_s(self.spec.deadline_s, self.submitted_at, time.time())
        if backpressure.too_late(left_s, config.min_deadline_s):
            return self.finish(
                self.result(
                    "rejected",
                    f"{backpressure.DEADLINE}: {max(left_s, 0):.1f}s left of deadline_s="
                    f"{self.spec.deadline_s:g} (minimum {config.min_deadline_s:g}s)",
                ),
                counter=backpressure.DEADLINE,
            )
        try:
            self.credential = agents.mint_for(self.ctx, self.spec, self.attempt, left_s)
        except ValueError as exc:
            return self.finish(self.result("rejected", f"planner.model: {exc}"))
        try:
            return self.lease_and_work(left_s)
        finally:
            agents.revoke(self.ctx, self.credential)

    def lease_and_work(self, left_s: float) -> JobResult:
        """Lease a slot, work in it, release it, commit the result (module docstring)."""
        config = self.ctx.config
        self.sweep()
        try:
            stamp = self.ctx.slots.lease(
                self.job_id,
                self.attempt,
                wait_s=backpressure.slot_wait_s(config.slot_wait_s, left_s, config.min_deadline_s),
                on_wait=self.while_waiting,
                tools=self.spec.tools,
            )
        except NoSlotFree as exc:
            return self.finish(
                self.result("rejected", f"{backpressure.NO_SLOT}: {exc}"),
                counter=backpressure.NO_SLOT,
            )
        except _Stopped as stopped:
            if stopped.reason == CANCELLED:
                return self.finish(self.result("cancelled", "cancelled while waiting for a slot"))
            return self.superseded(self.result("failed", "superseded while waiting for a slot"))
        self.lease = stamp
        self.keeper.hold(stamp)
        try:
            result = self.work(stamp)
        finally:
            self.keeper.drop()
            # A refused release means a reclaim already took the slot back; it is
            # logged there.
            with contextlib.suppress(ReleaseRefused):
                self.ctx.slots.release(stamp.slot_id, self.job_id, stamp.generation)
            if self.env is not None:  # held for the whole lease: never evicted under it
                self.env.close()
        if self.beat.superseded.is_set() or self.liveness.stop_reason(self.attempt) == SUPERSEDED:
            return self.superseded(result)
        return self.finish(result)

    def sweep(self) -> None:
        assert self.ctx.janitor is not None
        try:
            self.ctx.janitor.sweep()
        except Exception as exc:  # a sweep is housekeeping: never the job's failure
            self.ctx.log.emit(job_events.JANITOR_ERROR, error=f"{type(exc).__name__}: {exc}")

    def while_waiting(self) -> None:
        reason = self.stop_reason()
        if reason is not None:
            raise _Stopped(reason)
        assert self.ctx.janitor is not None
        with contextlib.suppress(Exception):
            self.ctx.janitor.maybe_sweep(_WAIT_SWEEP_S)

    def between_steps(self) -> str | None:
        self.keeper.renew_if_due(lock_timeout_s=_STEP_RENEW_LOCK_S)
        return self.stop_reason()

    def work(self, stamp: Stamp) -> JobResult:
        ctx, spec, job_id = self.ctx, self.spec, self.job_id
        slot_dir = ctx.settings.slots_dir / stamp.slot_id
        where = {"slot_id": stamp.slot_id, "generation": stamp.generation}
        try:
            prepared = ctx.workspaces.prepare(
                slot_dir, spec.repo, spec.base, job_id, fence=lambda: self.fenced(slot_dir, stamp)
            )
            job = {
                "job_id": job_id,
                "generation": stamp.generation,
                "test_command": spec.test_command,
                "test_timeout_s": spec.test_timeout_s,
            }
            if spec.environment is not None:
                try:
                    self.env = environment.take(
                        ctx, spec, prepared, attempt=self.attempt, should_stop=self.stop_reason
                    )
                except EnvError as exc:
                    return self.result("failed", str(exc), **where)
                job["environment"] = {"key": self.env.key, "mount": self.env.mount}
            with self.fenced(slot_dir, stamp):
                write_job(slot_dir, job)
            left_s = backpressure.deadline_left_s(spec.deadline_s, self.submitted_at, time.time())
            timed = spec.model_copy(update={"deadline_s": max(left_s, 0.001)})
            run = AgentRun(timed, stamp, slot_dir, ctx.client, should_stop=self.between_steps)
            records, planner_failure, planner_stats = self.drive(run, max(left_s, 0.001))
            if run.stopped in (SUPERSEDED, LEASE_LOST):
                # The tree may already belong to the janitor: touch nothing more.
                return self.result(
                    "failed",
                    "superseded by a newer attempt"
                    if run.stopped == SUPERSEDED
                    else "the slot lease was lost (reclaimed by the janitor)",
                    steps=[r.model_dump() for r in records],
                    counts=run.counts.model_dump(),
                    agent=self.agent_summary,
                    **where,
                )
            if run.stopped == CANCELLED:
                self.cancel_slot(stamp)
            with self.fenced(slot_dir, stamp):
                _, end_tree = ctx.workspaces.snapshot(slot_dir, job_id, "end")
                diff = ctx.workspaces.diff(slot_dir, prepared.base_commit)
            # An agent of one's own sees its calls' outcomes and decides: it fails by
            # raising or by its exit status.
            failed = [
                r
                for r in records
                if r.outcome in ("failed", "refused", "unknown")
                and not isinstance(spec.planner, PythonPlanner | CommandPlanner)
            ]
            if run.stopped == CANCELLED:
                state, reason = "cancelled", f"cancelled by request after {len(records)} step(s)"
            elif planner_failure is not None:
                state, reason = "failed", planner_failure
            elif failed:
                state = "failed"
                reason = f"step {failed[0].index} {failed[0].tool}: {failed[0].detail}"
            else:
                state, reason = "succeeded", None
            return self.result(
                state,
                reason,
                final_tree=end_tree,
                diff=diff,
                steps=[r.model_dump() for r in records],
                counts=run.counts.model_dump(),
                sandbox=_sandbox_mode(records),
                planner=planner_stats,
                agent=self.agent_summary,
                environment=self.env.summary() if self.env is not None else None,
                **where,
            )
        except WorkspaceError as exc:
            return self.result("failed", str(exc), **where)
        except LeaseLostError as exc:
            return self.result("failed", f"the slot lease was lost: {exc}", **where)

    def fenced(self, slot_dir: Path, stamp: Stamp) -> contextlib.AbstractContextManager[Stamp]:
        return fenced(slot_dir, stamp, self.job_id, self.attempt)

    def drive(
        self, run: AgentRun, deadline_s: float
    ) -> tuple[list[StepRecord], str | None, dict[str, int]]:
        """Run the job's planner over ``run``: its records, the planner's failure (the
        job's reason) and its counters. A python agent gets the lease's handle."""
        spec = self.spec.planner
        lease, credential = self.lease, self.credential
        if isinstance(spec, CommandPlanner):
            access = AgentAccess(
                self.job_id,
                self.attempt,
                mcp_url=lease.mcp_url if lease is not None else None,
                token=lease.token if lease is not None else None,
                gateway_url=credential.gateway_url if credential is not None else None,
                gateway_key=credential.secret if credential is not None else None,
            )
            ran = agents.drive_command(self.ctx, run, access, self.stop_reason)
            self.agent_summary = ran.summary or None
            return run.records, ran.failure, {}
        if isinstance(spec, PythonPlanner):
            workspace = Workspace(
                run,
                tools=self.spec.tools,
                token=lease.token if lease is not None else None,
                mcp_url=lease.mcp_url if lease is not None else None,
                gateway_url=credential.gateway_url if credential is not None else None,
                gateway_key=credential.secret if credential is not None else None,
            )
            outcome = run_function(
                self.agent_fn,
                workspace,
                spec.config,
                entry=spec.entry,
                remaining_s=run.remaining_s,
                stop_reason=self.stop_reason,
            )
            run.stopped = run.stopped or outcome.stopped
            if outcome.returned is not None:
                self.agent_summary = {"kind": "python", "returned": outcome.returned}
            return run.records, outcome.failure, {}
        planner = self.planner(deadline_s)
        failure = None
        try:
            run.run(planner)
        except PlannerStopped as exc:
            run.stopped = exc.reason
        except PlannerError as exc:
            failure = f"planner: {exc}"
        finally:
            if isinstance(planner, ChatPlanner):
                planner.close()
        return run.records, failure, dict(planner.stats) if isinstance(planner, ChatPlanner) else {}

    def planner(self, deadline_s: float) -> ScriptedSteps | ChatPlanner:
        """The job's planner; a chat planner leases every request from the run's desk."""
        spec = self.spec.planner
        if isinstance(spec, ScriptedPlanner):
            return ScriptedSteps(spec)
        assert not isinstance(spec, PythonPlanner | CommandPlanner)  # run by drive()
        desk = admission_desk(
            self.ctx.redis,
            spec,
            self.spec.eval_run,
            home=self.ctx.settings.home,
            recovery_hold_s=self.ctx.config.admission_recovery_hold_s,
        )
        return ChatPlanner(
            spec,
            desk,
            job_id=self.job_id,
            attempt=self.attempt,
            deadline_s=deadline_s,
            should_stop=self.stop_reason,
        )

    def cancel_slot(self, stamp: Stamp) -> None:
        """Mark the lease cancel_requested: still held (and counted) until released."""
        with contextlib.suppress(ReleaseRefused):
            self.ctx.slots.request_cancel(
                stamp.slot_id, self.job_id, stamp.generation, "cancel requested"
            )
            self.ctx.log.emit(
                job_events.SLOT_CANCEL_REQUESTED,
                slot_id=stamp.slot_id,
                generation=stamp.generation,
                job_id=self.job_id,
                attempt=self.attempt,
            )

    def superseded(self, result: JobResult) -> JobResult:
        current = self.ctx.redis.get(keys.job_attempt(self.job_id))
        self.ctx.log.emit(
            job_events.JOB_SUPERSEDED,
            job_id=self.job_id,
            attempt=self.attempt,
            current=int(current) if current is not None else None,
        )
        # The commit is refused by the attempt fence; trying keeps one code path.
        return self.finish(result)

    def finish(self, result: JobResult, counter: str | None = None) -> JobResult:
        return finish(self.ctx.redis, self.ctx.log, result, counter, home=self.ctx.settings.home)


def _sandbox_mode(records: list[Any]) -> str | None:
    """The sandbox mode of the job's test runs, with the warning of an unsandboxed one."""
    for record in records:
        if record.tool == "run_tests" and record.result and "sandbox" in record.result:
            warning = record.result.get("sandbox_warning")
            mode = str(record.result["sandbox"])
            return f"{mode} (WARNING: {warning})" if warning else mode
    return None
