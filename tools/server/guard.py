"""The tool server's door checks before any route runs: the token and the body's size.

A pure ASGI middleware, not ``@app.middleware("http")``: Starlette runs those through
``BaseHTTPMiddleware``, which wraps every request and response in an extra task group
and a streamed response, on every call (measured in ``bench/`` pipeline). This one
reads the headers in the scope and either answers at once or passes the call through,
counting the body's bytes as the route reads them.

A body over :data:`MAX_BODY_BYTES` is answered 413 ``too_large`` as soon as it is
known to be too large: from its ``Content-Length`` before a byte of it is read, or,
for a chunked body, at the chunk that passes the limit. The answer goes out at once,
and the rest of the body is then read and dropped (up to :data:`DRAIN_MAX_BYTES`)
before the connection is closed: closing a socket that still holds unread bytes makes
the kernel reset the connection, and a client still sending (``urllib`` asks for
``Connection: close``) would get that reset instead of the 413.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tools import registry, tokens
from tools.reasons import Reason

MAX_BODY_BYTES = registry.MAX_FILE_BYTES + 64 * 1024
# How much of a refused body is read and dropped before closing: enough for any client
# that sends a few times the limit, not an unbounded sink for one that never stops.
DRAIN_MAX_BYTES = 256 * 1024 * 1024
TOKEN_HEADER = "x-slotrunner-token"


def refusal_body(reason: Reason, message: str) -> bytes:
    return json.dumps({"error": reason.value, "message": message}).encode()


class _TooLarge(Exception):
    """The body passed the limit while the route was reading it (never leaves here)."""

    def __init__(self, more_body: bool) -> None:
        super().__init__("body too large")
        self.more_body = more_body


class Guard:
    """401 without the server token (but on ``/mcp``), 413 past the body limit."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)  # the first of repeated headers, as Starlette
        # The MCP door is authenticated by the caller's lease token alone
        # (tools.server.mcp.BearerAuth), which its Authorization header carries.
        if scope["path"] != tokens.MCP_PATH and not self._authorized(headers):
            body = refusal_body(Reason.UNAUTHORIZED, f"missing or wrong {TOKEN_HEADER} header")
            await _answer(send, 401, body)
            return
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            # An ``Expect: 100-continue`` client has sent nothing yet and sends nothing
            # after a final answer: there is nothing to drain.
            drain = headers.get(b"expect", b"").lower() != b"100-continue"
            await _too_large(send, receive if drain else None, f"body of {length} bytes")
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    raise _TooLarge(bool(message.get("more_body", False)))
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge as exc:
            if started:  # no route answers before reading its body; never seen
                raise
            await _too_large(send, receive if exc.more_body else None, "the body")

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        given = headers.get(TOKEN_HEADER.encode()) or headers.get(
            b"authorization", b""
        ).removeprefix(b"Bearer ")
        return hmac.compare_digest(given, self.token)


async def _answer(send: Send, status: int, body: bytes, *, more_body: bool = False) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


async def _too_large(send: Send, receive: Receive | None, what: str) -> None:
    """Answer 413 at once, then read and drop what the client still sends (``receive``)."""
    body = refusal_body(Reason.TOO_LARGE, f"{what} exceeds the limit of {MAX_BODY_BYTES} bytes")
    await _answer(send, 413, body, more_body=receive is not None)
    if receive is None:
        return
    # The answer is whole (its Content-Length is sent); the response ends only once the
    # client's body is read, so the server's close comes after the last byte it sent.
    drained = 0
    while drained <= DRAIN_MAX_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.body", "body": b"", "more_body": False})
