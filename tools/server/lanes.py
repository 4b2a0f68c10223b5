"""The two doors every call takes, served ahead of FastAPI's routing.

``POST /v1/tools/{tool}`` of a registered tool and the MCP door at ``/mcp`` carry every
tool call. Through FastAPI, each request also passes its exception middleware, its exit
stack, the router's match against every route and the endpoint's
dependency solving: none of which these two doors use. :class:`Lanes` is a pure ASGI
middleware inside :class:`tools.server.guard.Guard` (so the token and the body limit
hold as before) that hands these requests straight to their handler; a same-run A/B of
the tool server with and without it measured about 0.25 ms less per call (``bench/``
pipeline). Every other request, and any other method on these paths, goes on to the
app unchanged; the routes stay registered, so the OpenAPI document still describes them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tools.client import RETRY_HEADER

# A tool call's handler: (tool, body, the caller's x-slotrunner-retry) -> an ASGI reply.
ToolCall = Callable[[str, bytes, str | None], Awaitable[ASGIApp]]


class Lanes:
    """``POST /v1/tools/<tool>`` to ``call``, ``mcp_path`` to ``mcp``; the rest to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tools: Iterable[str],
        call: ToolCall,
        mcp_path: str,
        mcp: ASGIApp,
    ) -> None:
        self.app = app
        self.paths = {f"/v1/tools/{name}": name for name in tools}
        self.call = call
        self.mcp_path = mcp_path
        self.mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == self.mcp_path:
                await self.mcp(scope, receive, send)
                return
            tool = self.paths.get(path)
            if tool is not None and scope["method"] == "POST":
                request = Request(scope, receive)  # Starlette's body and headers, no routing
                try:
                    body = await request.body()  # the guard outside bounds its size
                except ClientDisconnect:
                    return  # the client left before its body was whole: nothing was run
                retry = request.headers.get(RETRY_HEADER)
                reply = await self.call(tool, body, retry)
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)
