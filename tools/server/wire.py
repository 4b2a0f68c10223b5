"""The tool server's bodies as models: what each route answers, for the published schema.

Every refusal is ``{error, message}`` with ``error`` a :class:`tools.reasons.Reason`;
each status has its own model naming the reasons it can carry (docs/architecture.md
§Tool API), so a client generated from the schema knows which ones to expect. A tool
call's 200 is ``{result, receipt, replayed}`` with the tool's own result model from
``tools.registry`` (or ``{error}`` when the tool ran and failed). The request bodies
are built here from the models the service validates with: ``tools.envelope.Envelope``
(its ``tool`` fixed to the operation's) and the registry's argument models.
``tools.server.openapi`` assembles the document from these.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from runner.core.ids import JOB_ID_RE, JOB_ID_RULE, JobId
from runner.core.stamp import Stamp
from tools import registry
from tools.envelope import Envelope
from tools.reasons import Reason
from tools.receipts.format import ReceiptModel


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True)


# -- refusals, one model per status --------------------------------------------------


class Unauthorized(_Body):
    error: Literal[Reason.UNAUTHORIZED]
    message: str


class Forbidden(_Body):
    error: Literal[Reason.OUTSIDE_WORKSPACE, Reason.TOOL_NOT_ALLOWED]
    message: str
    receipt: ReceiptModel | None = Field(
        default=None, description="the failed receipt, when a mutating call got this far"
    )


class FileNotFound(_Body):
    error: Literal[Reason.NOT_FOUND]
    message: str


class UnknownTool(_Body):
    error: Literal[Reason.UNKNOWN_TOOL]
    message: str


class Conflict(_Body):
    error: Literal[
        Reason.SLOT_JOB_MISMATCH,
        Reason.STALE_GENERATION,
        Reason.LEASE_EXPIRED,
        Reason.MISSING_IDEMPOTENCY_KEY,
        Reason.KEY_BOUND_TO_OTHER_JOB,
        Reason.SLOT_POISONED,
        Reason.SANDBOX_UNAVAILABLE,
        Reason.OUTCOME_UNKNOWN,
    ]
    message: str
    receipt: ReceiptModel | None = Field(
        default=None, description="outcome_unknown: the exec intent that has no outcome"
    )


class TooLarge(_Body):
    error: Literal[Reason.TOO_LARGE]
    message: str


class Malformed(_Body):
    error: Literal[Reason.MALFORMED]
    message: str


class Saturated(_Body):
    error: Literal[Reason.SATURATED]
    message: str


class OutcomeUnknown(_Body):
    error: Literal[Reason.OUTCOME_UNKNOWN]
    message: str


# -- receipts, slots, health ------------------------------------------------------------


class ReceiptFound(_Body):
    receipt: ReceiptModel


class NoReceipt(_Body):
    error: Literal["no_receipt"]
    status: Literal["absent", "not_applied"]
    key: str


class ReceiptUnknown(_Body):
    error: Literal[Reason.OUTCOME_UNKNOWN]
    status: Literal["unknown"]
    key: str
    message: str


class Slots(_Body):
    slots: list[Stamp]


class SandboxCheck(_Body):
    ok: bool
    detail: str


class Health(_Body):
    ok: bool
    host: str
    sandbox_mode: str
    sandbox: SandboxCheck | None = Field(description="the sandbox's self-test; null when off")
    recovered_intents: int = Field(ge=0, description="open intents resolved at start-up")


# -- MCP: JSON-RPC 2.0 as far as the door itself answers it ----------------------------


class JsonRpcError(_Body):
    code: int
    message: str
    data: Any = None


class JsonRpcRequest(_Body):
    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    method: str
    params: dict[str, Any] | None = None


class JsonRpcResponse(_Body):
    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    result: dict[str, Any] | None = None
    error: JsonRpcError | None = None


# -- one request and one reply model per tool ------------------------------------------


# The job-id rule (runner.core.ids) as a JSON Schema (ECMA-262) pattern: ``\Z`` is
# spelled ``$``, which there matches only at the very end, as fullmatch does.
_JOB_ID_SCHEMA: dict[str, Any] = {"pattern": "^" + JOB_ID_RE.pattern.replace(r"\Z", "$") + "$"}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


@cache
def call_model(spec: registry.ToolSpec) -> type[BaseModel]:
    """``{envelope, args}`` for one tool: the service's Envelope and argument model.

    ``args`` may be left out (or null) exactly when every argument has a default, as
    the service reads a missing ``args`` as ``{}``.
    """
    name = _camel(spec.name)
    only_this_tool: Any = Literal.__getitem__(spec.name)
    envelope = create_model(
        f"{name}Envelope",
        __base__=Envelope,
        __doc__=f"The call's envelope (docs/architecture.md §Envelope), for {spec.name}.",
        job_id=(JobId, Field(description=JOB_ID_RULE, json_schema_extra=_JOB_ID_SCHEMA)),
        tool=(only_this_tool, Field(description="the tool, as the URL names it")),
    )
    optional = not any(field.is_required() for field in spec.args_model.model_fields.values())
    args: Any = (spec.args_model | None, None) if optional else (spec.args_model, ...)
    return create_model(
        f"{name}Call",
        __config__=ConfigDict(extra="forbid", frozen=True),
        envelope=(envelope, ...),
        args=args,
    )


@cache
def reply_model(spec: registry.ToolSpec) -> type[BaseModel]:
    """The 200 body of one tool: its result (or a failure), its receipt, replayed or not."""
    result: Any = spec.result_model | registry.ToolFailure
    return create_model(
        f"{_camel(spec.name)}Reply",
        __base__=_Body,
        result=(result, ...),
        receipt=(
            ReceiptModel | None,
            Field(description="the call's receipt; null for a read-only tool"),
        ),
        replayed=(bool, Field(description="true when answered from an earlier outcome")),
    )
