"""The Python API for agent authors: the workspace handle of a ``python`` planner.

A job whose planner is ``{"kind": "python", "entry": "package.module:function",
"config": {...}}`` calls ``function(workspace, config)`` in the worker
(docs/architecture.md §Agents). ``workspace`` is a :class:`Workspace` for the slot
the job leased: one method per tool of the registry (``tools.registry``), named as
the tool, taking the tool's arguments as keyword arguments and returning its result
mapping::

    def fix(workspace: Workspace, config: dict[str, Any]) -> None:
        text = workspace.read_file(path="pkg/lock.py")["content"]
        workspace.write_file(path="pkg/lock.py", content=text.replace("None", "'A'"))
        if not workspace.run_tests()["passed"]:
            raise RuntimeError("the tests still fail")

Every method goes the way of a built-in planner's step (docs/architecture.md §Tool
call): the slot's envelope checked against its stamp, the retry classifier, the
receipts. A mutating call's idempotency key is ``<job>:a<attempt>:s<step>:<tool>``,
``step`` counting this handle's calls, so a resend is recognised by the receipt
store: after :class:`WorkspaceOutcomeUnknown`, calling the same tool with the same
arguments again resends it under the same key, and the server answers what the
first one did (``replayed``) or applies it once.

A stale or refused call raises :class:`WorkspaceCallError` with a ``reason``: a
:class:`tools.reasons.Reason` value (``stale_generation``, ``slot_job_mismatch``,
``lease_expired``, ``tool_not_allowed``, ``outside_workspace``, ``not_found``,
``malformed``, ``unknown_tool``, ...), or why the job stopped: ``superseded``,
``cancelled``, ``lease_lost``, ``deadline_exceeded``, ``max_steps``, ``closed`` (the
function already returned). A tool that ran and failed (a patch that does not apply,
tests that fail) is no exception: its result says so (``error``, ``passed``). The
function returns to succeed and raises to fail the job; the runner owns the lease,
the snapshots, the release and the result.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from runner.agent import openai_wire as wire
from runner.agent.loop import AgentRun
from runner.errors import RunnerError
from runner.jobs.models import JobSpec, Step, StepRecord
from tools import registry
from tools.client import OutcomeUnknown, ToolCallError, ToolRefused, TransportFailed
from tools.reasons import Reason

__all__ = [
    "CLOSED",
    "DEADLINE_EXCEEDED",
    "MAX_STEPS",
    "AgentFunction",
    "ToolMethod",
    "Workspace",
    "WorkspaceCallError",
    "WorkspaceOutcomeUnknown",
]

# Reasons of the handle's own, beside tools.reasons.Reason and the attempt's stop
# reasons (superseded, cancelled, lease_lost: runner.worker.attempt).
DEADLINE_EXCEEDED = "deadline_exceeded"
MAX_STEPS = "max_steps"
CLOSED = "closed"

ToolMethod = Callable[..., dict[str, Any]]


class WorkspaceCallError(RunnerError):
    """A call of the workspace handle that was refused, stale, or not made (``reason``
    says why, ``tool`` and ``step`` which call); nothing of it was applied."""

    def __init__(
        self, message: str, reason: str, *, tool: str | None = None, step: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.tool = tool
        self.step = step


class WorkspaceOutcomeUnknown(WorkspaceCallError):
    """Sent, and neither the reply nor the receipt store said what happened (reason
    ``outcome_unknown``, or ``transport_failed``); the same call again resends it under
    the same key."""


class Workspace:
    """The handle of one leased slot, given to a ``python`` planner's function.

    Built by the runner (``runner.worker.attempt``) over the attempt's agent loop;
    calls are serialised, as the slot's are. Tool methods come from the registry
    (``__getattr__``), so every registered tool has one; a tool outside the job
    spec's ``tools`` raises ``tool_not_allowed`` without being sent.
    """

    def __init__(
        self,
        run: AgentRun,
        *,
        tools: Iterable[str] | None = None,
        token: str | None = None,
        mcp_url: str | None = None,
        gateway_url: str | None = None,
        gateway_key: str | None = None,
    ) -> None:
        self._run = run
        allowed = set(registry.TOOLS) if tools is None else set(tools)
        self._tools = tuple(name for name in registry.TOOLS if name in allowed)
        self._token = token or None
        self._mcp_url = mcp_url or None
        self._gateway_url = gateway_url or None
        self._gateway_key = gateway_key or None
        self._lock = threading.Lock()
        self._closed: str | None = None
        self._next = 0
        # The last call whose outcome stayed unknown: (tool, canonical args, step).
        self._unsettled: tuple[str, str, int] | None = None

    # -- who and where ------------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        return self._run.spec.job_id

    @property
    def attempt(self) -> int | None:
        return self._run.stamp.attempt

    @property
    def slot_id(self) -> str:
        return self._run.stamp.slot_id

    @property
    def generation(self) -> int:
        return self._run.stamp.generation

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools this job may call, in the registry's order."""
        return self._tools

    @property
    def spec(self) -> JobSpec:
        """The job's spec, its ``deadline_s`` counted from when this attempt began."""
        return self._run.spec

    @property
    def closed(self) -> str | None:
        """Why every call is refused now (the job stopped, the deadline passed, the
        function returned: the reasons of :meth:`close`), or None while open."""
        return self._closed

    @property
    def token(self) -> str | None:
        """The lease's bearer token (docs/architecture.md §Lease tokens), for a client
        of the MCP endpoint; None when the lease has none."""
        return self._token

    @property
    def mcp_url(self) -> str | None:
        return self._mcp_url

    @property
    def gateway_url(self) -> str | None:
        """The admission gateway's URL for this job (an OpenAI-compatible base URL);
        None while the runner gives none."""
        return self._gateway_url

    @property
    def gateway_key(self) -> str | None:
        """The job's credential at the gateway (an OpenAI client's ``api_key``)."""
        return self._gateway_key

    @property
    def steps(self) -> list[StepRecord]:
        """The calls made so far, as the job result will list them."""
        with self._lock:
            return list(self._run.records)

    # -- tools ----------------------------------------------------------------------

    def __getattr__(self, name: str) -> ToolMethod:
        if name.startswith("_") or registry.get(name) is None:
            raise AttributeError(
                f"{type(self).__name__!r} has no attribute {name!r} "
                f"(its tools: {', '.join(self.tools)})"
            )

        def method(**args: Any) -> dict[str, Any]:
            return self.call(name, args)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = registry.describe(name)
        return method

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.tools})

    def openai_tools(self) -> list[dict[str, Any]]:
        """The allowed tools in OpenAI's function-calling format, each with the JSON
        schema of the argument model the tool server validates with."""
        out = []
        for name in self.tools:
            schema = registry.TOOLS[name].args_model.model_json_schema()
            schema.pop("title", None)
            out.append(wire.function_tool(name, registry.describe(name), schema))
        return out

    def call(self, name: str, args: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        """Execute one tool call, as a model names it: ``args`` a mapping or the JSON
        text of one (an OpenAI tool call's ``function.arguments``). Validated against
        the tool's argument model before anything is sent."""
        with self._lock:
            return self._call(name, args)

    def close(self, reason: str = CLOSED) -> None:
        """The runner's: refuse every later call with ``reason``. Waits for a call in
        flight, so once this returns the handle can no longer touch the slot."""
        with self._lock:
            if self._closed is None:
                self._closed = reason

    @contextlib.contextmanager
    def outside_call(self, tool: str) -> Iterator[tuple[AgentRun, int]]:
        """One call the agent sends itself, through the MCP door with :attr:`token` (an
        adapter's: ``runner.agent.adapters.openai_agents``). Refused as this handle's
        own calls are (closed, the job stopping, ``max_steps`` calls made, the deadline
        passed), it takes a step and holds the handle until the block ends, so that
        :meth:`close` waits for it. Yields the agent run, for the block to record the
        call in (``records``, ``counts``), and the step's index."""
        with self._lock:
            self._check_open(tool)
            index = self._next
            if index >= self._run.spec.max_steps:
                raise WorkspaceCallError(
                    f"{tool}: max_steps={self._run.spec.max_steps} calls made", MAX_STEPS, tool=tool
                )
            self._next += 1
            self._check_deadline(tool, index)
            yield self._run, index

    # -- one call -----------------------------------------------------------------

    def _check_open(self, name: str) -> None:
        """Raise unless the handle is open and the job need not stop."""
        if self._closed is not None:
            raise WorkspaceCallError(
                f"{name}: the workspace is closed ({self._closed})", self._closed, tool=name
            )
        run = self._run
        stop = run.should_stop() if run.should_stop is not None else None
        if stop is not None:
            run.stopped = self._closed = stop
            raise WorkspaceCallError(f"{name}: the job stopped ({stop})", stop, tool=name)

    def _check_deadline(self, name: str, index: int) -> None:
        """Record the call as failed, close the handle and raise once the deadline passed."""
        if self._run.remaining_s() > 0:
            return
        self._run.records.append(
            StepRecord(
                index=index,
                tool=name,
                idempotency_key=None,
                outcome="failed",
                detail="deadline exceeded",
            )
        )
        self._closed = DEADLINE_EXCEEDED
        raise WorkspaceCallError(
            f"{name}: the job's deadline has passed", DEADLINE_EXCEEDED, tool=name, step=index
        )

    def _call(self, name: str, raw: Mapping[str, Any] | str | None) -> dict[str, Any]:
        if self._closed is not None:
            raise WorkspaceCallError(
                f"{name}: the workspace is closed ({self._closed})", self._closed, tool=name
            )
        args, problem = _parse(name, raw)
        if problem is None and name not in self._tools:
            problem = (
                Reason.TOOL_NOT_ALLOWED,
                f"{name} is not among this job's tools ({', '.join(self._tools)})",
            )
        if problem is not None:
            self._refuse_locally(name, *problem)
        self._check_open(name)
        run = self._run
        canonical = json.dumps(args, sort_keys=True, default=str)
        resend = self._unsettled
        if resend is not None and resend[:2] == (name, canonical):
            index = resend[2]
        else:
            index = self._next
            if index >= run.spec.max_steps:
                raise WorkspaceCallError(
                    f"{name}: max_steps={run.spec.max_steps} calls made", MAX_STEPS, tool=name
                )
            self._next += 1
        self._check_deadline(name, index)
        sent = run.send(index, Step(tool=name, args=args))
        run.records.append(sent.record)
        if sent.error is not None:
            unknown = isinstance(sent.error, OutcomeUnknown | TransportFailed)
            self._unsettled = (name, canonical, index) if unknown else None
            raise _converted(sent.error, name, index)
        self._unsettled = None
        assert sent.response is not None
        return dict(sent.response.result)

    def _refuse_locally(self, name: str, reason: Reason, message: str) -> None:
        """Record a call refused before sending (it takes a step) and raise."""
        index = self._next
        self._next += 1
        self._run.counts.tool_calls += 1
        self._run.records.append(
            StepRecord(
                index=index,
                tool=name[:64] or "?",
                idempotency_key=None,
                outcome="refused",
                detail=f"{reason.value}: {message}",
            )
        )
        raise WorkspaceCallError(f"{name}: {message}", reason.value, tool=name, step=index)


def _parse(
    name: str, raw: Mapping[str, Any] | str | None
) -> tuple[dict[str, Any], tuple[Reason, str] | None]:
    """The call's arguments as a dict, and why they cannot be sent (or None)."""
    spec = registry.get(name)
    if spec is None:
        known = ", ".join(registry.TOOLS)
        return {}, (Reason.UNKNOWN_TOOL, f"unknown tool {name!r}; known: {known}")
    if raw is None:
        raw = {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except ValueError:
            return {}, (Reason.MALFORMED, f"arguments of {name} are not JSON")
    if not isinstance(raw, Mapping):
        return {}, (Reason.MALFORMED, f"arguments of {name} are not an object")
    args = dict(raw)
    try:
        spec.args_model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'args'}: {err['msg']}"
            for err in exc.errors()[:4]
        )
        return args, (Reason.MALFORMED, f"bad arguments for {name}: {problems}")
    return args, None


def _converted(error: ToolCallError, tool: str, step: int) -> WorkspaceCallError:
    reason = error.error if isinstance(error, ToolRefused) else error.reason.value
    kind = (
        WorkspaceOutcomeUnknown
        if isinstance(error, OutcomeUnknown | TransportFailed)
        else WorkspaceCallError
    )
    failed = kind(f"{tool} (step {step}): {error}", reason, tool=tool, step=step)
    failed.__cause__ = error
    return failed


AgentFunction = Callable[[Workspace, dict[str, Any]], object]
