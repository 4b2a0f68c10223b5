"""The tool server's lanes (tools/server/lanes.py): which requests skip FastAPI's routing.

Driven as ASGI, message by message, so each case shows exactly what reached which
handler; the real server's doors (tokens, body limit, both APIs) are covered through
HTTP by test_guard.py, test_limits.py, test_server.py and test_mcp.py, all of which
now pass through the lanes.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tools.client import RETRY_HEADER
from tools.server.lanes import Lanes


class Recorder:
    """What reached each handler: the app behind the lanes, the MCP door, the tool calls."""

    def __init__(self) -> None:
        self.app: list[str] = []
        self.mcp: list[str] = []
        self.calls: list[tuple[str, bytes, str | None]] = []

    def lanes(self) -> Lanes:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self.app.append(f"{scope.get('method')} {scope['path']}")
            await PlainTextResponse("app")(scope, receive, send)

        async def mcp(scope: Scope, receive: Receive, send: Send) -> None:
            self.mcp.append(f"{scope['method']} {scope['path']}")
            await PlainTextResponse("mcp")(scope, receive, send)

        async def call(tool: str, body: bytes, retry: str | None) -> ASGIApp:
            self.calls.append((tool, body, retry))
            return PlainTextResponse(f"called {tool}")

        return Lanes(app, tools=["write_file", "read_file"], call=call, mcp_path="/mcp", mcp=mcp)


def request(
    lanes: Lanes,
    method: str,
    path: str,
    chunks: list[bytes] | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    disconnect: bool = False,
) -> list[Message]:
    """Send one request through ``lanes``; the messages it sent back."""
    incoming: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks or [b""]) - 1}
        for i, chunk in enumerate(chunks or [b""])
    ]
    if disconnect:
        incoming[-1]["more_body"] = True
        incoming.append({"type": "http.disconnect"})
    sent: list[Message] = []
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
        "query_string": b"",
    }

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(lanes, scope, receive, send)
    return sent


def body_of(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_tool_call_goes_to_the_call_handler_with_its_whole_body_and_retry_header() -> None:
    seen = Recorder()
    headers = [(b"content-type", b"application/json"), (RETRY_HEADER.encode(), b"reconcile")]
    sent = request(seen.lanes(), "POST", "/v1/tools/write_file", [b'{"a": ', b"1}"], headers)
    assert seen.calls == [("write_file", b'{"a": 1}', "reconcile")]
    assert body_of(sent) == b"called write_file"
    assert seen.app == [] and seen.mcp == []


def test_a_call_without_the_retry_header_passes_none() -> None:
    seen = Recorder()
    request(seen.lanes(), "POST", "/v1/tools/read_file", [b"{}"])
    assert seen.calls == [("read_file", b"{}", None)]


def test_a_client_gone_before_its_body_is_whole_runs_nothing() -> None:
    seen = Recorder()
    sent = request(seen.lanes(), "POST", "/v1/tools/write_file", [b'{"a"'], disconnect=True)
    assert seen.calls == [] and seen.app == [] and sent == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/tools/write_file"),  # another method: the app answers 405 as before
        ("POST", "/v1/tools/no_such_tool"),  # not a tool's name: the app's unknown_tool
        ("POST", "/v1/tools/write_file/"),  # not exactly the tool's path
        ("GET", "/healthz"),
        ("GET", "/openapi.json"),
    ],
)
def test_every_other_request_goes_on_to_the_app(method: str, path: str) -> None:
    seen = Recorder()
    sent = request(seen.lanes(), method, path, [b"{}"])
    assert seen.app == [f"{method} {path}"]
    assert seen.calls == [] and seen.mcp == []
    assert body_of(sent) == b"app"


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_the_mcp_path_goes_to_the_mcp_door_whatever_the_method(method: str) -> None:
    seen = Recorder()
    sent = request(seen.lanes(), method, "/mcp", [b"{}"])
    assert seen.mcp == [f"{method} /mcp"] and seen.app == [] and seen.calls == []
    assert body_of(sent) == b"mcp"


def test_a_lifespan_scope_goes_to_the_app() -> None:
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["type"])

    async def never(*_: Any) -> Any:
        raise AssertionError("no request was sent")

    lanes = Lanes(app, tools=["write_file"], call=never, mcp_path="/mcp", mcp=never)
    anyio.run(lanes, {"type": "lifespan"}, never, never)
    assert reached == ["lifespan"]
