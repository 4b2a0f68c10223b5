"""Job spec and job result: the records that cross Celery, Redis and the CLI."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runner.core.ids import JobId
from tools import registry

JobState = Literal["succeeded", "failed", "rejected", "cancelled"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_Model):
    tool: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptedPlanner(_Model):
    kind: Literal["scripted"]
    steps: list[Step] = Field(min_length=1)


class OpenAIPlanner(_Model):
    kind: Literal["openai"]
    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    api_key_env: str | None = None
    request_timeout_s: float = Field(default=60.0, gt=0)
    temperature: float = 0.0
    # In-flight inference requests allowed for the whole eval-run, across workers (I6).
    admission_bound: int = Field(default=4, ge=1, le=4096)


# ``package.module:function`` (dotted names on both sides: a function of a class works).
ENTRY_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


class PythonPlanner(_Model):
    """A user's agent function, called in the worker as ``fn(workspace, config)``
    (docs/architecture.md §Agents); whether ``entry`` imports is checked before any
    slot is leased (``runner.jobs.entry``)."""

    kind: Literal["python"]
    entry: str = Field(min_length=3, max_length=512)
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("entry")
    @classmethod
    def _entry_shape(cls, value: str) -> str:
        if not re.fullmatch(ENTRY_PATTERN, value):
            raise ValueError(f"{value!r} is not of the form 'package.module:function'")
        return value


Planner = Annotated[ScriptedPlanner | OpenAIPlanner | PythonPlanner, Field(discriminator="kind")]


def unknown_tools(names: Iterable[str]) -> str | None:
    """Why a list of tool names cannot narrow a job (names the registry lacks), or None."""
    unknown = sorted({name for name in names if registry.get(name) is None})
    if not unknown:
        return None
    return f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(sorted(registry.TOOLS))}"


class JobSpec(_Model):
    job_id: JobId | None = None
    eval_run: str = Field(default="default", min_length=1, max_length=128)
    repo: str = Field(min_length=1)
    base: str = Field(default="HEAD", min_length=1, max_length=256)
    planner: Planner
    test_command: list[str] = Field(default_factory=list)
    test_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    deadline_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    max_steps: int = Field(default=50, ge=1, le=10_000)
    # The tools the job's lease may call (docs/architecture.md §Job spec); None: all.
    tools: list[str] | None = Field(default=None, min_length=1)

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: list[str] | None) -> list[str] | None:
        problem = None if value is None else unknown_tools(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("test_command")
    @classmethod
    def _argv(cls, value: list[str]) -> list[str]:
        if any(not isinstance(part, str) or "\x00" in part for part in value):
            raise ValueError("test_command must be an argv list of strings without NUL")
        return value

    @model_validator(mode="after")
    def _steps_within_limit(self) -> JobSpec:
        if isinstance(self.planner, ScriptedPlanner) and len(self.planner.steps) > self.max_steps:
            raise ValueError(
                f"the scripted planner has {len(self.planner.steps)} steps, "
                f"more than max_steps={self.max_steps}"
            )
        return self

    def with_job_id(self) -> JobSpec:
        if self.job_id:
            return self
        return self.model_copy(update={"job_id": f"job-{uuid.uuid4().hex[:12]}"})


class StepRecord(BaseModel):
    index: int
    tool: str
    idempotency_key: str | None
    outcome: str  # applied | replayed | read | failed | refused | unknown
    detail: str | None = None
    result: dict[str, Any] | None = None


class Counts(BaseModel):
    tool_calls: int = 0
    retries: int = 0
    stale_rejects: int = 0
    replayed: int = 0
    receipts: int = 0


class JobResult(BaseModel):
    job_id: str
    state: JobState
    attempt: int
    slot_id: str | None = None
    generation: int | None = None
    final_tree: str | None = None
    diff: str = ""
    steps: list[StepRecord] = Field(default_factory=list)
    counts: Counts = Field(default_factory=Counts)
    reason: str | None = None
    sandbox: str | None = None
    planner: dict[str, int] = Field(default_factory=dict)
