"""A streamed answer whose lease ends with the response, however the response ends.

Starlette's ``StreamingResponse`` iterates the body and stops: when the caller goes
away it cancels the iteration, and when a write fails it leaves the iterator
suspended, to be closed whenever the garbage collector gets to it. The lease of a
streamed request must come back when the stream ends (docs/architecture.md
§Gateway), so :class:`LeasedStream` closes its iterator itself, at once, on every
way out; the iterator's ``finally`` (``runner.gateway.forward.Forwarder.relay``)
releases the lease.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.agent import openai_wire as wire


class LeasedStream(StreamingResponse):
    """A stream of server-sent events whose body iterator is closed when it ends."""

    def __init__(
        self, body: AsyncGenerator[bytes, None], status_code: int, headers: dict[str, str]
    ) -> None:
        super().__init__(body, status_code, headers=headers)
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()


def error_event(message: str) -> bytes:
    """An error in the middle of a stream, as OpenAI sends one (its clients raise it)."""
    payload = wire.error_object(message, "upstream_error", "stream_broken")
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
