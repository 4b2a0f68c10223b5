"""The MCP benchmark's floor server: the official ``mcp`` package, doing nothing.

The same door as the tool server's (``tools.server.mcp``): a low-level ``Server`` behind
``StreamableHTTPSessionManager`` in stateless JSON mode, with no OpenTelemetry
middleware, under uvicorn started as the tool server is (127.0.0.1, warning log level,
no access log). ``tools/call`` of any name answers at once with the structured body a
successful ``write_file`` has; ``tools/list`` offers ``write_file``. No token is read:
what it measures is what the package itself costs a call, client and server, beside a
no-op HTTP endpoint (``bench.noop_server``) under the same stack.

    python -m bench.noop_mcp --port 8124
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bench.noop_server import serve

REPLY: dict[str, Any] = {
    "result": {"bytes": 40},
    "receipt": {"status": "applied"},
    "replayed": False,
}
TOOL = types.Tool(name="write_file", input_schema={"type": "object"})


def create_app() -> Starlette:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[TOOL])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="applied")],
            structured_content=REPLY,
            is_error=False,
        )

    server: Server[Any] = Server(
        "slotrunner-bench-noop",
        version="0.1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.middleware = []  # as the tool server's door: no span per message
    manager = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    class Endpoint:  # an instance, so Starlette passes it the raw ASGI call
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await manager.handle_request(scope, receive, send)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(
        routes=[Route("/mcp", endpoint=Endpoint()), Route("/healthz", endpoint=healthz)],
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    serve(lambda _: create_app(), "python -m bench.noop_mcp", argv)


if __name__ == "__main__":
    main()
