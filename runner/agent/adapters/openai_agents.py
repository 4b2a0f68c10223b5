"""The OpenAI Agents SDK in a slot: an ``Agent`` whose tools are the slot's, over MCP.

A job runs it as a ``python`` planner (docs/architecture.md §Agents)::

    {"kind": "python", "entry": "runner.agent.adapters.openai_agents:run",
     "config": {"task": "...", "instructions": "...", "max_turns": 30,
                "model": {"scripted": [{"tool": "apply_patch", "args": {"patch": "..."}},
                                       {"tool": "run_tests"}, {"final": "done"}]}}}

``model`` is the SDK's own ``ScriptedModel`` (``scripted``: one turn each, a tool call
``{"tool", "args", "call_id"?}`` or a last answer ``{"final"}``, as the fake endpoint's
script) or ``{"name": "<model>"}``: ``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI``
client at the job's admission gateway (``workspace.gateway_url`` and its credential
``workspace.gateway_key``), so the model's requests hold leases of the run's desk.

- **Tools**: ``MCPServerStreamableHttp`` at ``workspace.mcp_url`` with
  ``Authorization: Bearer <lease token>`` (§Lease tokens, §MCP); tools listed once,
  since a lease's tools do not change.
- **Keys**: ``tool_meta_resolver`` gives each mutating call
  ``_meta["slotrunner/idempotency_key"] = <job>:a<attempt>:sdk:<tool call id>``. The
  SDK resolves it once per model tool call and resends the same ``_meta`` on its own
  retries, so the receipt store answers a resend; the job and attempt keep a local
  server's ``call_0`` apart across runs, and a call id seen again in one run gets
  ``~<n>`` so that it is a new call, not a replay of the first.
- **Timeouts**: the session's read timeout outlasts the longest call the slot can
  make (``run_tests`` at the job's ``test_timeout_s``, ``exec`` at its cap), within the
  deadline: a slow call is never cut by the client and sent again by the model as a
  new call.
- **Fence**: each call goes through ``Workspace.outside_call``: refused once the handle
  is closed or the job must stop, and ``close`` waits for a call in flight, so once
  the runner has closed the handle no call of the agent reaches the slot. A task
  watching the handle then cancels the run (the model's request in flight is
  dropped), and the function returns. Each call is a step of the job's result.
- **Refusals**: a refusal no turn of the model can mend (``stale_generation``,
  ``slot_job_mismatch``, ``lease_expired``, ``slot_poisoned``, ...), a stop, and a call
  whose outcome stayed unknown after the SDK's retries (the model would resend it
  under a new key) end the run: ``call_tool`` raises ``WorkspaceCallError`` with the
  reason, the tool's failure hook re-raises it instead of showing it to the model,
  and :func:`run` raises it, failing the job with that reason. Refusals of the call
  itself (``mcp_steps.MODEL_REASONS``) and tools that ran and failed (``tool_failed``, tests
  that fail) are results the model reads.
- **Offline**: tracing off (``set_tracing_disabled`` and ``RunConfig``); the only
  network is the tool server and the gateway. ``agents`` is imported when a job runs.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runner.agent.adapters import mcp_steps as steps
from runner.agent.api import Workspace, WorkspaceCallError, WorkspaceOutcomeUnknown
from tools import registry
from tools.envelope import KEY_MAX_CHARS
from tools.reasons import Reason
from tools.server.mcp import KEY_META

if TYPE_CHECKING:
    from agents.mcp import MCPServerStreamableHttp
    from agents.mcp.util import MCPToolMetaContext
    from agents.models.interface import Model
    from mcp.types import CallToolResult

__all__ = ["CallKeys", "OpenAIAgentsConfig", "run", "session_timeout_s"]

SERVER_NAME = "slotrunner"
# A saturated server refused before running anything: the same call, same key, later.
SATURATED_TRIES = 5
SATURATED_WAIT_S = 0.5
HTTP_TIMEOUT_S = 30.0  # connecting and sending; the reply's wait is session_timeout_s
WATCH_S = 0.1

DEFAULT_INSTRUCTIONS = (
    "You work in a git checkout through tools. Paths are relative to its root. Change "
    "what the task asks, run the tests with run_tests, and answer when they pass. A "
    "refused call's text starts with its reason."
)


class ScriptedTurn(BaseModel):
    """One turn of the scripted model: a tool call or the last answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str | None = Field(default=None, min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = Field(default=None, min_length=1, max_length=200)
    final: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptedTurn:
        if (self.tool is None) == (self.final is None):
            raise ValueError('a turn is either {"tool": NAME, "args": {...}} or {"final": TEXT}')
        return self


class ModelChoice(BaseModel):
    """The SDK's scripted model, or a model behind the job's admission gateway."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    scripted: list[ScriptedTurn] | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1, max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_retries: int = Field(default=2, ge=0, le=10)  # the openai client's (429, 5xx)
    request_timeout_s: float = Field(default=120.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_model(self) -> ModelChoice:
        if (self.scripted is None) == (self.name is None):
            raise ValueError('model is either {"scripted": [...]} or {"name": MODEL}')
        return self


class OpenAIAgentsConfig(BaseModel):
    """The ``config`` of a job that runs this adapter."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: ModelChoice
    task: str = Field(
        default="Fix the code so that the tests pass, then run the tests.", min_length=1
    )
    instructions: str = DEFAULT_INSTRUCTIONS
    max_turns: int = Field(default=30, ge=1, le=1000)


def session_timeout_s(test_timeout_s: float, deadline_s: float) -> float:
    """How long the MCP client waits for one reply: past the longest call the slot can
    make (a ``run_tests``, an ``exec`` at its cap), bounded by the job's deadline."""
    longest = max(test_timeout_s, registry.MAX_EXEC_TIMEOUT_S)
    return min(longest, deadline_s) + registry.EXEC_REPLY_MARGIN_S


class CallKeys:
    """The idempotency keys of one run's mutating calls (the module docstring)."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self.prefix = f"{job_id}:a{attempt}:sdk:"
        self._seen: Counter[str] = Counter()

    def key(self, call_id: str | None) -> str:
        name = call_id or "call"
        if len(self.prefix) + len(name) + 8 > KEY_MAX_CHARS:
            name = hashlib.sha256(name.encode()).hexdigest()[:32]
        seen = self._seen[name]
        self._seen[name] += 1
        return f"{self.prefix}{name}~{seen}" if seen else f"{self.prefix}{name}"

    def meta(self, ctx: MCPToolMetaContext) -> dict[str, Any] | None:
        """The SDK's ``tool_meta_resolver``: called once per model tool call."""
        spec = registry.get(ctx.tool_name)
        if spec is None or not spec.mutating:
            return None
        return {KEY_META: self.key(getattr(ctx.run_context, "tool_call_id", None))}


def run(workspace: Workspace, config: dict[str, Any]) -> str:
    """The ``python`` planner's entry: run the agent until it answers; its last answer.
    Raises ``WorkspaceCallError`` when a refusal or a stop ended the run."""
    settings = OpenAIAgentsConfig.model_validate(config)
    if workspace.mcp_url is None or workspace.token is None:
        raise RuntimeError(
            "this job's lease has no MCP URL or token: is the tool server's URL set?"
        )
    return asyncio.run(_drive(workspace, settings))


async def _drive(workspace: Workspace, settings: OpenAIAgentsConfig) -> str:
    from agents import Agent, ModelSettings, RunConfig, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    model = _model(workspace, settings.model)
    async with _slot_server(workspace) as server:
        agent = Agent(
            name="slotrunner-agent",
            instructions=settings.instructions,
            model=model,
            model_settings=ModelSettings(temperature=settings.model.temperature),
            mcp_servers=[server],
        )
        running = asyncio.create_task(
            Runner.run(
                agent,
                settings.task,
                max_turns=settings.max_turns,
                run_config=RunConfig(tracing_disabled=True),
            )
        )
        watching = asyncio.create_task(_until_closed(workspace))
        await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        watching.cancel()
        if not running.done():
            # The handle is closed and no call is in flight (close waited for it): drop
            # the model's request, if one is out, and end here.
            running.cancel()
            await asyncio.wait({running})
            reason = workspace.closed or "closed"
            raise WorkspaceCallError(f"the job stopped ({reason})", reason)
        try:
            result = running.result()
        except Exception as exc:
            refused = _refusal_in(exc)
            if refused is None:
                raise
            raise type(refused)(
                str(refused), refused.reason, tool=refused.tool, step=refused.step
            ) from None
    return str(result.final_output)


async def _until_closed(workspace: Workspace) -> None:
    while workspace.closed is None:
        await asyncio.sleep(WATCH_S)


def _refusal_in(exc: BaseException) -> WorkspaceCallError | None:
    """The refusal behind an error of the SDK (it wraps a tool's exception)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, WorkspaceCallError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _model(workspace: Workspace, choice: ModelChoice) -> Model:
    if choice.scripted is not None:
        from agents.testing import ScriptedModel, assistant_message, function_call

        turns = [
            [assistant_message(turn.final)]
            if turn.final is not None
            else [function_call(str(turn.tool), turn.args, call_id=turn.call_id or f"call_{i}")]
            for i, turn in enumerate(choice.scripted)
        ]
        return ScriptedModel(turns)
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    if workspace.gateway_url is None or workspace.gateway_key is None:
        raise RuntimeError("the runner gave this job no admission gateway (gateway_url)")
    client = AsyncOpenAI(
        base_url=workspace.gateway_url,
        api_key=workspace.gateway_key,
        max_retries=choice.max_retries,
        timeout=choice.request_timeout_s,
    )
    return OpenAIChatCompletionsModel(model=str(choice.name), openai_client=client)


def _failure(ctx: Any, error: Exception) -> str:
    """The MCP tools' ``failure_error_function``: a refusal ends the run (re-raised out
    of ``Runner.run``); any other error is shown to the model, as the SDK's default."""
    from agents.tool import default_tool_error_function

    refused = _refusal_in(error)
    if refused is not None:
        raise refused
    return default_tool_error_function(ctx, error)


def _slot_server(workspace: Workspace) -> MCPServerStreamableHttp:
    from agents.mcp import MCPServerStreamableHttp

    spec = workspace.spec
    assert workspace.job_id is not None and workspace.attempt is not None
    wait_s = session_timeout_s(spec.test_timeout_s, spec.deadline_s)
    keys = CallKeys(workspace.job_id, workspace.attempt)

    class SlotServer(MCPServerStreamableHttp):
        """The slot's MCP door, each call fenced by the workspace handle."""

        serial = asyncio.Lock()  # the slot takes one call at a time; so does the handle

        async def call_tool(
            self,
            tool_name: str,
            arguments: dict[str, Any] | None,
            meta: dict[str, Any] | None = None,
        ) -> CallToolResult:
            async with self.serial:
                key = (meta or {}).get(KEY_META)
                with workspace.outside_call(tool_name) as (agent_run, index):
                    agent_run.counts.tool_calls += 1
                    try:
                        result = await self._call(tool_name, arguments, meta)
                    except Exception as exc:
                        agent_run.records.append(
                            steps.record(index, tool_name, key, "unknown", f"no reply: {exc}")
                        )
                        if key is None:
                            raise  # a read: shown to the model, which may read again
                        raise WorkspaceOutcomeUnknown(
                            f"{tool_name} (step {index}): no reply: {exc}",
                            Reason.OUTCOME_UNKNOWN.value,
                            tool=tool_name,
                            step=index,
                        ) from exc
                    done, reason = steps.step(index, tool_name, key, result, agent_run.counts)
                    agent_run.records.append(done)
            if reason is not None:
                raise WorkspaceCallError(
                    f"{tool_name} (step {index}): {steps.text(result)[:500]}",
                    reason,
                    tool=tool_name,
                    step=index,
                )
            return result

        async def _call(
            self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None
        ) -> CallToolResult:
            for _ in range(SATURATED_TRIES - 1):
                result = await super().call_tool(tool_name, arguments, meta)
                if not result.is_error or steps.reason_code(result) != Reason.SATURATED:
                    return result
                await asyncio.sleep(SATURATED_WAIT_S)
            return await super().call_tool(tool_name, arguments, meta)

    return SlotServer(
        params={
            "url": str(workspace.mcp_url),
            "headers": {"Authorization": f"Bearer {workspace.token}"},
            "timeout": HTTP_TIMEOUT_S,
            "sse_read_timeout": wait_s,
        },
        name=SERVER_NAME,
        cache_tools_list=True,
        client_session_timeout_seconds=wait_s,
        max_retry_attempts=2,
        retry_backoff_seconds_base=0.2,
        tool_meta_resolver=keys.meta,
        failure_error_function=_failure,
    )
