"""The tool server's OpenAPI document, from the models the server validates with.

FastAPI writes the operations of the routes ``tools.server.app`` declares, each with
the responses :func:`tool_responses` and friends list (their bodies are
``tools.server.wire``'s models); :func:`document` adds what FastAPI cannot see: the
request body of each tool (the body is decoded and validated by the service, not by
FastAPI, so the same checks run for both doors), the security schemes, and the MCP
door, a raw ASGI route. ``GET /openapi.json`` serves it; ``schemathesis`` fuzzes the
live server against it (tests/tools/server/test_schemathesis.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tools import registry, tokens
from tools.server import wire
from tools.server.guard import MAX_BODY_BYTES, TOKEN_HEADER

Responses = dict[int | str, dict[str, Any]]

DESCRIPTION = f"""\
One host's tool server (docs/architecture.md §Tool API). Every call carries the
envelope of the lease it is made under; a refusal is `{{error, message}}` with `error`
one of the reasons of docs/architecture.md §Reasons. Bodies over {MAX_BODY_BYTES} bytes
are refused 413 before they are read."""

_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before sending again",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
}
_WWW_AUTHENTICATE = {
    "WWW-Authenticate": {"required": True, "schema": {"type": "string", "pattern": "^Bearer"}}
}
SERVER_SECURITY: list[dict[str, list[str]]] = [{"serverToken": []}, {"serverBearer": []}]


def _schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    """A JSON body whatever the route's own media type (``/metrics`` is text)."""
    return {"application/json": {"schema": _schema_ref(model.__name__)}}


def guard_responses(*, token: bool) -> Responses:
    """What the door's guard answers on every route, before the route runs."""
    responses: Responses = {
        413: {
            "content": _json(wire.TooLarge),
            "description": "too_large: the body is over the limit",
        }
    }
    if token:
        responses[401] = {
            "content": _json(wire.Unauthorized),
            "description": f"unauthorized: no or a wrong {TOKEN_HEADER} (or Bearer) token",
        }
    return responses


def malformed(what: str) -> Responses:
    return {422: {"model": wire.Malformed, "description": f"malformed: {what}"}}


def tool_responses(spec: registry.ToolSpec, *, token: bool) -> Responses:
    responses: Responses = {
        200: {
            "model": wire.reply_model(spec),
            "description": "the call's outcome; a tool that ran and failed has "
            "`result.error` (and a `failed` receipt)",
        },
        403: {
            "model": wire.Forbidden,
            "description": "outside_workspace (a path out of the work tree) or "
            "tool_not_allowed (not among the lease's tools)",
        },
        409: {
            "model": wire.Conflict,
            "description": "the envelope is not the slot's live lease, or the key, slot or "
            "sandbox refuses the call",
        },
        **malformed("not JSON, nested too deeply, a bad envelope or bad arguments"),
        429: {
            "model": wire.Saturated,
            "description": "saturated: too many calls in flight",
            "headers": _RETRY_AFTER,
        },
        500: {
            "model": wire.OutcomeUnknown,
            "description": "outcome_unknown: the receipt could not be made durable (the slot "
            "is poisoned), or the call failed inside the server",
        },
        **guard_responses(token=token),
    }
    if not spec.mutating:
        responses[404] = {"model": wire.FileNotFound, "description": "not_found: no such file"}
    return responses


def tool_request_body(spec: registry.ToolSpec) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _schema_ref(wire.call_model(spec).__name__)}
            },
        }
    }


def any_tool_responses(*, token: bool) -> Responses:
    """``POST /v1/tools/{tool}`` for any name: a tool's name reaches that tool's own
    operation (its responses, united here), any other name is 404 ``unknown_tool``."""
    responses: Responses = {}
    for spec in registry.TOOLS.values():
        for status, entry in tool_responses(spec, token=token).items():
            if "model" not in entry:
                responses[status] = entry
                continue
            united = responses.setdefault(status, dict(entry))
            if united["model"] is not entry["model"]:
                united["model"] = united["model"] | entry["model"]
    responses[404] = {
        "model": wire.FileNotFound | wire.UnknownTool,
        "description": "unknown_tool: no tool of that name; not_found: no such file",
    }
    responses[200]["description"] = "the named tool's outcome (see its operation)"
    return responses


def receipt_responses(*, token: bool) -> Responses:
    unknown = "outcome_unknown: an exec intent without outcome"
    return {
        200: {"model": wire.ReceiptFound, "description": "the key's outcome"},
        404: {
            "model": wire.NoReceipt | wire.Malformed,
            "description": "no_receipt (status absent or not_applied), or malformed for a "
            "slot this host does not have",
        },
        409: {"model": wire.ReceiptUnknown, "description": unknown},
        503: {
            "model": wire.ReceiptUnknown,
            "description": "outcome_unknown: the outcome could not be recorded",
        },
        **malformed("no slot query parameter"),
        **guard_responses(token=token),
    }


def _mcp_operation() -> dict[str, Any]:
    rpc = {"application/json": {"schema": _schema_ref(wire.JsonRpcResponse.__name__)}}
    return {
        "post": {
            "operationId": "mcp",
            "summary": "The MCP door (streamable HTTP, stateless, JSON responses)",
            "description": "docs/architecture.md §MCP: `tools/list` and `tools/call` for the "
            "lease the bearer token was minted for. Any JSON-RPC message; a notification "
            "is answered 202.",
            "security": [{"leaseToken": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _schema_ref(wire.JsonRpcRequest.__name__)}
                },
            },
            "responses": {
                "200": {"description": "the JSON-RPC response", "content": rpc},
                "202": {"description": "a notification or response, accepted"},
                "401": {
                    "description": "unauthorized: no lease token, or one this host never minted",
                    "headers": _WWW_AUTHENTICATE,
                    "content": rpc,
                },
                "400": {
                    "description": "not a JSON-RPC message (a JSON-RPC error), or not sent "
                    "as application/json (text)",
                    "content": {**rpc, "text/plain": {"schema": {"type": "string"}}},
                },
                "406": {"description": "Accept does not name application/json", "content": rpc},
                "413": {"description": "too_large", "content": _json(wire.TooLarge)},
            },
        }
    }


def document(app: FastAPI, *, token: bool) -> dict[str, Any]:
    """The whole OpenAPI document of ``app`` (built once, then cached by FastAPI)."""
    doc = get_openapi(
        title=app.title, version=app.version, description=DESCRIPTION, routes=app.routes
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    extra = [*(wire.call_model(spec) for spec in registry.TOOLS.values())]
    extra += [wire.JsonRpcRequest, wire.JsonRpcResponse, wire.TooLarge, wire.Unauthorized]
    _, defs = models_json_schema(
        [(model, "validation") for model in extra], ref_template="#/components/schemas/{model}"
    )
    for name, schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    doc["components"]["securitySchemes"] = {
        "serverToken": {"type": "apiKey", "in": "header", "name": TOKEN_HEADER},
        "serverBearer": {"type": "http", "scheme": "bearer", "description": "the server token"},
        "leaseToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "a lease token (`slotrunner slots lease --json`: `token`)",
        },
    }
    for operations in doc["paths"].values():
        for operation in operations.values():
            # FastAPI's own 422 body, for parameters it validates: the server answers
            # those with its own {error, message} (documented where they can happen).
            responses = operation["responses"]
            if "HTTPValidationError" in str(responses.get("422")):
                del responses["422"]
            if token:  # without a server token (loopback only) only /mcp asks for one
                operation["security"] = SERVER_SECURITY
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    doc["paths"][tokens.MCP_PATH] = _mcp_operation()
    return doc
