"""The agent loop: ask the planner for the next step, call the tool, record it.

Every call carries the slot's envelope and an idempotency key bound to this job,
attempt and step, so a resend of the same step is recognised by the receipt store
and a new attempt never collides with an old one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.core.stamp import Stamp
from runner.jobs.models import Counts, JobSpec, ScriptedPlanner, Step, StepRecord
from tools import registry
from tools.client import StaleEnvelope, ToolCallError, ToolClient, ToolResponse
from tools.envelope import Envelope


class Planner(Protocol):
    def steps(self) -> Iterator[Step]: ...

    def observe(self, record: StepRecord) -> None: ...


class ScriptedSteps:
    """Replays a fixed list of steps; the demo's and the tests' planner."""

    def __init__(self, planner: ScriptedPlanner) -> None:
        self._steps = list(planner.steps)

    def steps(self) -> Iterator[Step]:
        yield from self._steps

    def observe(self, record: StepRecord) -> None:
        return None


@dataclass(frozen=True)
class Sent:
    """What one call gave: its record, and its response or its error (one of the two)."""

    record: StepRecord
    response: ToolResponse | None = None
    error: ToolCallError | None = None


def idempotency_key(job_id: str, attempt: int, index: int, tool: str) -> str:
    return f"{job_id}:a{attempt}:s{index}:{tool}"


class AgentRun:
    def __init__(
        self,
        spec: JobSpec,
        stamp: Stamp,
        slot_dir: Path,
        client: ToolClient,
        should_stop: Callable[[], str | None] | None = None,
    ) -> None:
        assert spec.job_id is not None and stamp.attempt is not None
        self.spec = spec
        self.stamp = stamp
        self.slot_dir = slot_dir
        self.client = client
        # Asked before every step (never during one: an in-flight call finishes); a
        # reason ("cancelled", "superseded") ends the loop and lands in ``stopped``.
        self.should_stop = should_stop
        self.stopped: str | None = None
        self.records: list[StepRecord] = []
        self.counts = Counts()
        self.started = time.monotonic()

    def remaining_s(self) -> float:
        return self.spec.deadline_s - (time.monotonic() - self.started)

    def run(self, planner: Planner) -> list[StepRecord]:
        for index, step in enumerate(planner.steps()):
            if index >= self.spec.max_steps:
                break
            if self.should_stop is not None:
                self.stopped = self.should_stop()
                if self.stopped is not None:
                    break
            if self.remaining_s() <= 0:
                self.records.append(
                    StepRecord(
                        index=index,
                        tool=step.tool,
                        idempotency_key=None,
                        outcome="failed",
                        detail="deadline exceeded",
                    )
                )
                break
            record = self.call(index, step)
            self.records.append(record)
            planner.observe(record)
            if record.outcome in ("failed", "refused", "unknown"):
                break
        return self.records

    def call(self, index: int, step: Step) -> StepRecord:
        return self.send(index, step).record

    def send(self, index: int, step: Step) -> Sent:
        """One tool call: its record, and the whole response or the error behind it
        (a ``python`` agent's workspace handle answers from these, ``runner.agent.api``)."""
        assert self.spec.job_id is not None and self.stamp.attempt is not None
        spec = registry.get(step.tool)
        key = (
            idempotency_key(self.spec.job_id, self.stamp.attempt, index, step.tool)
            if spec is None or spec.mutating
            else None
        )
        envelope = Envelope(
            job_id=self.spec.job_id,
            attempt=self.stamp.attempt,
            slot_id=self.stamp.slot_id,
            generation=self.stamp.generation,
            tool=step.tool,
            idempotency_key=key,
        )
        self.counts.tool_calls += 1
        before = sum(self.client.decisions.values())
        try:
            response = self.client.call(
                envelope,
                step.args,
                slot_dir=self.slot_dir,
                deadline_s=max(self.remaining_s(), 0.001),
            )
        except StaleEnvelope as exc:
            self.counts.stale_rejects += 1
            record = StepRecord(
                index=index, tool=step.tool, idempotency_key=key, outcome="refused", detail=str(exc)
            )
            return Sent(record, error=exc)
        except ToolCallError as exc:
            if exc.reason in ("stale_generation", "slot_job_mismatch", "lease_expired"):
                self.counts.stale_rejects += 1
            outcome = "unknown" if exc.reason == "outcome_unknown" else "refused"
            record = StepRecord(
                index=index, tool=step.tool, idempotency_key=key, outcome=outcome, detail=str(exc)
            )
            return Sent(record, error=exc)
        finally:
            self.counts.retries += sum(self.client.decisions.values()) - before
        return Sent(self._record(index, step, key, response), response=response)

    def _record(
        self, index: int, step: Step, key: str | None, response: ToolResponse
    ) -> StepRecord:
        if response.replayed:
            self.counts.replayed += 1
        if response.receipt is not None:
            self.counts.receipts += 1
        status = (response.receipt or {}).get("status")
        if status == "failed":
            outcome, detail = "failed", (response.receipt or {}).get("detail")
        elif step.tool == "run_tests" and not response.result.get("passed", False):
            outcome, detail = "failed", f"tests failed (exit {response.result.get('exit_code')})"
        else:
            outcome = "replayed" if response.replayed else ("applied" if key else "read")
            detail = None
        return StepRecord(
            index=index,
            tool=step.tool,
            idempotency_key=key,
            outcome=outcome,
            detail=detail,
            result=_trim(response.result),
        )


def _trim(result: dict[str, object]) -> dict[str, object]:
    """Keep results small in the job record (file contents and logs are cut)."""
    out: dict[str, object] = {}
    for name, value in result.items():
        if isinstance(value, str) and len(value) > 2000:
            out[name] = value[:2000] + f"... [{len(value) - 2000} more characters]"
        else:
            out[name] = value
    return out
