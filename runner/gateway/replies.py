"""What the gateway answers with: OpenAI error objects, the upstream's headers, streams.

Errors are OpenAI error objects (``runner/agent/openai_wire.py``), so every client
reports them as it reports its provider's. An upstream answer is passed on with its
own headers, less the hop-by-hop ones and those this server writes itself.

A streamed answer's lease must end with the response, however the response ends
(docs/architecture.md §Gateway). Starlette's ``StreamingResponse`` iterates the body
and stops: when the caller goes away it cancels the iteration, and when a write
fails it leaves the iterator suspended, to be closed whenever the garbage collector
gets to it. So :class:`LeasedStream` closes its iterator itself, at once, on every
way out, and then calls ``ended``: the iterator's ``finally``
(``runner.gateway.flight.Flight.relay``) has released the lease already, unless
it never started (the caller left before the first byte), and ``ended`` does then.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

import anyio
import httpx
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.agent import openai_wire as wire

# Upstream response headers not passed on: hop-by-hop, or this server's to write.
_DROPPED = frozenset(
    {
        *("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"),
        *("proxy-authenticate", "proxy-authorization", "content-length", "content-encoding"),
        *("date", "server", "set-cookie"),
    }
)


def error(
    status: int, message: str, kind: str, code: str, headers: Mapping[str, str] | None = None
) -> Response:
    """An OpenAI error object, so every client reports it as it reports its provider's."""
    body = json.dumps(wire.error_object(message, kind, code)).encode()
    return Response(body, status, headers=dict(headers or {}), media_type="application/json")


def passed_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROPPED}


def is_event_stream(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("text/event-stream")


class LeasedStream(StreamingResponse):
    """A stream of server-sent events whose body iterator is closed when it ends."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        status_code: int,
        headers: dict[str, str],
        ended: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(body, status_code, headers=headers)
        self._body = body
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                await self._ended()  # a no-op when the body's own finally ran


def error_event(message: str) -> bytes:
    """An error in the middle of a stream, as OpenAI sends one (its clients raise it)."""
    payload = wire.error_object(message, "upstream_error", "stream_broken")
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
