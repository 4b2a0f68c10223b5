"""Job spec and job result: the records that cross Celery, Redis and the CLI."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runner.core.ids import JobId
from runner.jobs import plain_json
from tools import registry

JobState = Literal["succeeded", "failed", "rejected", "cancelled"]


class _Model(BaseModel):
    # strict: a spec is JSON, and a value of the wrong JSON type is refused, never
    # converted (``"max_steps": true`` is not 1, ``"deadline_s": "600"`` not 600.0).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Step(_Model):
    tool: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptedPlanner(_Model):
    kind: Literal["scripted"]
    steps: list[Step] = Field(min_length=1)


class OpenAIPlanner(_Model):
    kind: Literal["openai"]
    base_url: str = Field(min_length=1, max_length=2000)
    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    api_key_env: str | None = None
    request_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    temperature: float = 0.0
    # In-flight inference requests allowed for the whole eval-run, across workers (I6).
    admission_bound: int = Field(default=4, ge=1, le=4096)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return env_name(value)


def http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def env_name(value: str | None) -> str | None:
    """An environment variable's name (the worker looks it up: a NUL there would raise)."""
    if value is not None and not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a variable name (letters, digits, _; at most 128)")
    return value


class ModelAccess(_Model):
    """The ``model`` block of a ``python`` or ``command`` planner: the agent's own model
    traffic goes through the admission gateway to ``base_url``, every request holding a
    lease of the eval-run's desk (docs/architecture.md §Gateway). The fields are the
    openai planner's; ``admission_wait_s`` is how long a request may wait for a lease."""

    base_url: str = Field(min_length=1, max_length=2000)  # the upstream's API base
    api_key_env: str | None = Field(default=None, min_length=1, max_length=200)
    request_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    admission_bound: int = Field(default=4, ge=1, le=4096)
    admission_wait_s: float = Field(default=30.0, ge=0, le=86_400)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return env_name(value)


# What a ``command`` agent is given (runner.agent.command); its spec's ``env`` may not
# set any of them, nor anything else of slotrunner's own namespace.
RESERVED_ENV_PREFIX = "SLOTRUNNER_"
# With a ``model`` block these point OpenAI clients at the gateway: not the spec's either.
MODEL_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def env_problem(env: dict[str, str], *, model: bool) -> str | None:
    """Why a ``command`` planner's ``env`` cannot be used, or None."""
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            return f"env: {name!r} is not a variable name (letters, digits, _; at most 128)"
        if name.upper().startswith(RESERVED_ENV_PREFIX):
            return f"env: {name} is slotrunner's to set (names starting {RESERVED_ENV_PREFIX})"
        if model and name.upper() in MODEL_ENV:
            return f"env: {name} is set by the runner to the gateway when a model block is given"
        if "\x00" in value or len(value) > 65_536:
            return f"env: the value of {name} has a NUL or is longer than 65536 characters"
    return None


# ``package.module:function`` (dotted names on both sides: a function of a class works).
ENTRY_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


class PythonPlanner(_Model):
    """A user's agent function, called in the worker as ``fn(workspace, config)``
    (docs/architecture.md §Agents); whether ``entry`` imports is checked before any
    slot is leased (``runner.jobs.entry``)."""

    kind: Literal["python"]
    entry: str = Field(min_length=3, max_length=512)
    config: dict[str, Any] = Field(default_factory=dict)
    model: ModelAccess | None = None

    @field_validator("entry")
    @classmethod
    def _entry_shape(cls, value: str) -> str:
        if not re.fullmatch(ENTRY_PATTERN, value):
            raise ValueError(f"{value!r} is not of the form 'package.module:function'")
        return value


class CommandPlanner(_Model):
    """An external agent process, of any language, started by the worker with the lease's
    MCP URL and token in its environment (``runner.agent.command``,
    docs/architecture.md §Agents)."""

    kind: Literal["command"]
    argv: list[str] = Field(min_length=1, max_length=1024)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    model: ModelAccess | None = None

    @field_validator("argv")
    @classmethod
    def _argv(cls, value: list[str]) -> list[str]:
        if any("\x00" in part for part in value):
            raise ValueError("argv must be a list of strings without NUL")
        program = value[0]
        if not program or ("/" in program and not program.startswith("/")):
            # Its working directory is a fresh scratch directory: a relative path would
            # name nothing there.
            raise ValueError(
                f"argv[0] {program!r} must be a program name looked up on PATH or an absolute path"
            )
        return value

    @model_validator(mode="after")
    def _env_names(self) -> CommandPlanner:
        problem = env_problem(self.env, model=self.model is not None)
        if problem:
            raise ValueError(problem)
        return self


Planner = Annotated[
    ScriptedPlanner | OpenAIPlanner | PythonPlanner | CommandPlanner,
    Field(discriminator="kind"),
]


def unknown_tools(names: Iterable[str]) -> str | None:
    """Why a list of tool names cannot narrow a job (names the registry lacks), or None."""
    unknown = sorted({name for name in names if registry.get(name) is None})
    if not unknown:
        return None
    # A name that is no identifier is shown as repr: it is anyone's text (a newline, a
    # lone surrogate, which pydantic cannot encode in its error and raises instead).
    shown = ", ".join(name if name.isidentifier() else repr(name) for name in unknown)
    return f"unknown tool(s) {shown}; known: {', '.join(sorted(registry.TOOLS))}"


class EnvironmentSpec(_Model):
    """A job's ``environment``: built once per key from the base commit's files and
    shown read-only to every ``run_tests`` and ``exec`` of the jobs that share it
    (docs/architecture.md §Environments). ``$ENV`` in an argument is the
    environment's directory; ``timeout_s`` bounds each setup command."""

    setup: list[list[str]] = Field(min_length=1, max_length=32)
    key_files: list[str] | None = Field(default=None, min_length=1, max_length=64)
    network: bool = True
    timeout_s: float = Field(default=900.0, gt=0, le=6 * 3600)

    @field_validator("setup")
    @classmethod
    def _argvs(cls, value: list[list[str]]) -> list[list[str]]:
        for number, argv in enumerate(value, 1):
            if not argv or len(argv) > 1024 or any("\x00" in part for part in argv):
                raise ValueError(f"setup command {number} must be a non-empty argv without NUL")
            program = argv[0]
            if not program or ("/" in program and not program.startswith(("/", "$ENV/"))):
                raise ValueError(
                    f"setup command {number}: argv[0] {program!r} must be a program on PATH, "
                    "an absolute path or a path under $ENV/"
                )
        return value

    @field_validator("key_files")
    @classmethod
    def _relative(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            parts = name.split("/")
            if (
                not name
                or name.startswith("/")
                or any(part in ("", ".", "..") for part in parts)
                or any(c in name for c in "\x00\n\r")
            ):
                raise ValueError(
                    f"key_files: {name!r} must be a path relative to the repository's root "
                    "(no '..', no leading '/')"
                )
        return value


class JobSpec(_Model):
    job_id: JobId | None = None
    eval_run: str = Field(default="default", min_length=1, max_length=128)
    repo: str = Field(min_length=1, max_length=4096)
    base: str = Field(default="HEAD", min_length=1, max_length=256)
    planner: Planner
    test_command: list[str] = Field(default_factory=list, max_length=1024)
    test_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    deadline_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    max_steps: int = Field(default=50, ge=1, le=10_000)
    # The tools the job's lease may call (docs/architecture.md §Job spec); None: all.
    tools: list[str] | None = Field(default=None, min_length=1)
    environment: EnvironmentSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        problem = plain_json.problem(data) if isinstance(data, dict) else None
        if problem:
            raise ValueError(problem)
        return data

    @field_validator("repo", "base")
    @classmethod
    def _no_option(cls, value: str) -> str:
        # The workspace refuses these when it prepares the tree (runner/workspace/): a
        # spec that can never run is refused before any slot is leased for it.
        if value.startswith("-") or any(c in value for c in "\x00\n\r"):
            raise ValueError(f"{value!r} starts with '-' or holds a NUL or line break")
        return value

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
    # A ``command`` agent's process: exit code, how it ended, its output's tail
    # (runner.agent.command.CommandOutcome.summary); for a ``python`` agent, what its
    # function returned (``{"kind": "python", "returned": ...}``, runner.agent.function).
    agent: dict[str, Any] | None = None
    # The job's built environment: its key, whether this job built it, the build's
    # and the wait's seconds, the build log (runner.envs.build.Ready.summary).
    environment: dict[str, Any] | None = None
