"""The tool server's MCP door: streamable HTTP at ``/mcp``, one lease token per caller.

Built on the official ``mcp`` package's low-level server in stateless JSON mode (no
session kept between requests: any request may reach any server process, and a
restart loses nothing). ``docs/architecture.md`` §MCP describes the contract:

* ``Authorization: Bearer <lease token>``; a missing, malformed, forged or unknown
  token is answered 401 here, before the MCP layer reads the body (:class:`BearerAuth`).
* ``tools/list``: the tools the token's lease may call, each with the JSON schema of
  the argument model the service validates with (``tools.registry``).
* ``tools/call``: the envelope is built from the token's record and the call goes to
  ``tools.server.dispatch.Dispatcher.call``, the same function as
  ``POST /v1/tools/{tool}``: the verdict under the slot lock, tools, key, path,
  receipts, log line and counters are the HTTP API's, with nothing checked here.
* A mutating call's idempotency key is ``_meta["slotrunner/idempotency_key"]``; without
  one, a fresh key is minted for the call (so a client's resend is a new call).
* A refusal is a result with ``isError: true`` whose text starts with the reason.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from runner.core import events
from runner.core.settings import Settings
from tools import registry, tokens
from tools.reasons import Reason
from tools.server.dispatch import Dispatcher
from tools.server.reply import Reply

KEY_META = "slotrunner/idempotency_key"
# Where BearerAuth leaves the token's record for the handlers (ctx.request.scope).
SCOPE_KEY = "slotrunner.lease"
SERVER_NAME = "slotrunner"


def tool_definitions() -> dict[str, types.Tool]:
    """Every registered tool as MCP describes it, its schema from its argument model."""
    defined = {}
    for name, spec in registry.TOOLS.items():
        schema = spec.args_model.model_json_schema()
        schema.pop("title", None)
        defined[name] = types.Tool(
            name=name,
            description=registry.describe(name),
            input_schema=schema,
            annotations=types.ToolAnnotations(
                read_only_hint=not spec.mutating, destructive_hint=spec.mutating
            ),
        )
    return defined


def _text(result: Reply) -> tuple[bool, str]:
    """Whether the reply is an error for the model, and the text it reads."""
    body = result.body
    if result.http_status != 200:
        reason, message = str(body.get("error", "refused")), str(body.get("message", ""))
        return True, message if message.startswith(f"{reason}:") else f"{reason}: {message}"
    if result.outcome == events.OUTCOME_FAILED:
        error = (body.get("result") or {}).get("error", "")
        return True, f"tool_failed: {error}\n{json.dumps(body)}"
    return False, json.dumps(body)


def to_result(reply: Reply) -> types.CallToolResult:
    """The service's reply as an MCP tool result: the HTTP body as structured content."""
    is_error, text = _text(reply)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=reply.body,
        is_error=is_error,
    )


def error_result(reason: Reason, message: str) -> types.CallToolResult:
    body = {"error": reason.value, "message": message}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{reason.value}: {message}")],
        structured_content=body,
        is_error=True,
    )


def call_payload(record: tokens.TokenRecord, tool: str, arguments: Any, key: Any) -> Any:
    """The ``{envelope, args}`` body of ``POST /v1/tools/{tool}`` for this token's lease."""
    spec = registry.get(tool)
    if key is None and spec is not None and spec.mutating:
        key = f"mcp-{uuid.uuid4().hex}"  # no key from the client: this call is new
    envelope = {
        "job_id": record.job_id,
        "attempt": record.attempt,
        "slot_id": record.slot_id,
        "generation": record.generation,
        "tool": tool,
        "idempotency_key": key,
    }
    return {"envelope": envelope, "args": arguments if arguments is not None else {}}


class McpDoor:
    """The MCP server of one tool server app: handlers, session manager, ASGI endpoint."""

    def __init__(self, settings: Settings, dispatcher: Dispatcher) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.tools = tool_definitions()
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version="0.1.0",
            instructions=(
                "Tools of one slotrunner workspace slot. Paths are relative to the work "
                "tree. A refused call's text starts with the reason code."
            ),
            # Schemas are the same for every caller; which tools a caller may use is
            # decided on the call (tools/list only shows them).
            get_tool_input_schema=self._schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        # No OpenTelemetry span per message: the JSONL log line is the call's record.
        self.server.middleware = []
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            stateless=True,
            json_response=True,
            max_request_body_size=registry.MAX_FILE_BYTES + 1024 * 1024,
        )
        self.endpoint = BearerAuth(_Endpoint(self.manager), settings)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's task group, for the app's lifespan (entered once)."""
        async with self.manager.run():
            yield

    def _schema(self, name: str) -> Mapping[str, Any] | None:
        tool = self.tools.get(name)
        return tool.input_schema if tool is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        record = _record(ctx)
        return types.ListToolsResult(
            tools=[tool for name, tool in self.tools.items() if record.allows(name)]
        )

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        # Everything is caught: an exception would become a JSON-RPC error (leaking its
        # text on the handshake path) instead of a result the model can read.
        try:
            started = time.monotonic()
            record = _record(ctx)
            meta = params.meta or {}
            payload = call_payload(record, params.name, params.arguments, meta.get(KEY_META))
            return to_result(await self.dispatcher.call(params.name, payload, started))
        except Exception as exc:
            return error_result(
                Reason.OUTCOME_UNKNOWN, f"the call failed inside the server: {type(exc).__name__}"
            )


def _record(ctx: ServerRequestContext[Any]) -> tokens.TokenRecord:
    assert ctx.request is not None, "the MCP door serves HTTP only"
    record: tokens.TokenRecord = ctx.request.scope[SCOPE_KEY]
    return record


class _Endpoint:
    """The session manager as a raw ASGI app (a class instance: Starlette would wrap a
    function or bound method as a request/response endpoint)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.manager.handle_request(scope, receive, send)


_UNAUTHORIZED = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": None,
        # JSON-RPC shaped, so an MCP client reports the message instead of a bare 401.
        "error": {"code": -32600, "message": "unauthorized: missing or unknown lease token"},
    }
).encode()


class BearerAuth:
    """401 unless the request carries a lease token this host minted; pure ASGI.

    The token's record goes into the scope for the handlers. Whether its lease still
    holds is not decided here but by the envelope verdict on each call.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        record = None
        if scheme.lower() == "bearer":
            record = tokens.authenticate(self.settings.slots_dir, self.settings.host, token.strip())
        if record is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                        (b"www-authenticate", b'Bearer realm="slotrunner"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _UNAUTHORIZED})
            return
        scope[SCOPE_KEY] = record
        await self.app(scope, receive, send)
