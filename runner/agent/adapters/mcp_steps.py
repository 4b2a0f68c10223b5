"""An MCP tool result of the slot's door as a step of the job, for adapters whose
agent calls the tool server's ``/mcp`` itself (``runner.agent.adapters.openai_agents``).

The door's results (docs/architecture.md §MCP): ``structuredContent`` is the HTTP
API's body, ``{result, receipt, replayed}``; a refusal is ``isError`` with the body
``{error, message}`` and a text starting with the reason; a tool that ran and failed
is ``isError`` with the HTTP body and a text starting ``tool_failed:``. Each becomes a
:class:`runner.jobs.models.StepRecord` and the run's counts, as ``runner.agent.loop``
records its own calls; :func:`step` also says whether a refusal ends the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.types import CallToolResult

from runner.jobs.models import Counts, StepRecord
from tools.reasons import Reason

TOOL_FAILED = "tool_failed"
# Refusals of the call itself: the model can read them and do better next turn. Every
# other refusal (the fence's, a poisoned slot, an unknown outcome) no turn can mend.
MODEL_REASONS = frozenset(
    {Reason.MALFORMED, Reason.NOT_FOUND, Reason.OUTSIDE_WORKSPACE, Reason.TOO_LARGE}
    | {Reason.TOOL_NOT_ALLOWED, Reason.UNKNOWN_TOOL}
)
FENCE_REASONS = frozenset({Reason.STALE_GENERATION, Reason.SLOT_JOB_MISMATCH, Reason.LEASE_EXPIRED})
RESULT_CHARS = 2000


def text(result: CallToolResult) -> str:
    """The result's text, as the model reads it."""
    return "".join(getattr(item, "text", "") for item in result.content)


def reason_code(result: CallToolResult) -> str:
    """A refused result's reason code: the text before its first colon."""
    return text(result).partition(":")[0].strip()


def step(
    index: int, tool: str, key: str | None, result: CallToolResult, counts: Counts
) -> tuple[StepRecord, str | None]:
    """The call's step record (``counts`` updated as ``runner.agent.loop`` updates its
    own), and the reason that must end the run, or None."""
    body: Mapping[str, Any] = result.structured_content or {}
    # A refusal's body is {error, message}; a tool that ran and failed keeps the HTTP body.
    refusal = str(body.get("error") or reason_code(result)) if result.is_error else None
    if refusal is None or refusal == TOOL_FAILED:
        outcome, detail = "read" if key is None else "applied", None
        if body.get("replayed"):
            counts.replayed += 1
            outcome = "replayed"
        if body.get("receipt") is not None:
            counts.receipts += 1
        raw = body.get("result")
        found: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        if result.is_error:
            outcome, detail = "failed", str(found.get("error") or text(result))[:RESULT_CHARS]
        elif tool == "run_tests" and not found.get("passed", False):
            outcome, detail = "failed", f"tests failed (exit {found.get('exit_code')})"
        return record(index, tool, key, outcome, detail, found), None
    if refusal in FENCE_REASONS:
        counts.stale_rejects += 1
    outcome = "unknown" if refusal == Reason.OUTCOME_UNKNOWN else "refused"
    ends = None if refusal in MODEL_REASONS else (refusal or Reason.REFUSED.value)
    return record(index, tool, key, outcome, text(result)[:RESULT_CHARS]), ends


def record(
    index: int,
    tool: str,
    key: str | None,
    outcome: str,
    detail: str | None,
    result: Mapping[str, Any] | None = None,
) -> StepRecord:
    """One step; a result's long texts (file contents, test output) cut, as the loop does."""
    kept = None
    if result is not None:
        kept = {k: v[:RESULT_CHARS] if isinstance(v, str) else v for k, v in result.items()}
    return StepRecord(
        index=index, tool=tool, idempotency_key=key, outcome=outcome, detail=detail, result=kept
    )
