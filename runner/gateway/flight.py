"""One request's admission lease at the gateway: a :class:`Flight`, released exactly
once by whoever ends the request, and the relay of a streamed answer under it.

The desk calls and the outcome counts are :class:`runner.gateway.forward.Forwarder`'s;
a flight only says when (docs/architecture.md §Gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol, TypeVar

import anyio
import httpx
import redis

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import Lease, StaleCompletion
from runner.agent import openai_wire as wire
from runner.gateway.metrics import GatewayMetrics
from runner.gateway.replies import error_event

T = TypeVar("T")


class Forwarder(Protocol):
    """What a flight needs of :class:`runner.gateway.forward.Forwarder`: its counts, and
    its worker threads for the blocking desk calls."""

    metrics: GatewayMetrics

    async def quick(self, fn: Callable[..., T], *args: Any) -> T: ...


_DONE_TAIL = wire.SSE_DONE.rstrip()  # b"data: [DONE]"
_DONE_KEPT = len(_DONE_TAIL) + 4  # with the longest blank line after it, b"\r\n\r\n"


def _ends_with_done(tail: bytes) -> bool:
    """Whether the bytes passed on so far end with the ``[DONE]`` event, its blank
    line included (either line ending)."""
    for end in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        if tail.endswith(end):
            return tail[: -len(end)].endswith(_DONE_TAIL)
    return False


async def _drain(response: httpx.Response) -> None:
    """Read what is left of an answer no one will get, then close it.

    A streamed answer arrives as soon as its headers do: the upstream is done with the
    request only at the stream's end, and until then it still counts the request open.
    Closing early would give the capacity back while the upstream still serves the
    request, and the next admitted one would make one more than the bound there (I6, I7),
    so the rest is read and dropped first, as a whole answer is read before it arrives.
    """
    try:
        if not response.is_stream_consumed:
            async for _ in response.aiter_raw():
                pass
    except httpx.HTTPError:
        pass  # broken off: the upstream is done with it either way
    finally:
        await response.aclose()


class Flight:
    """One request's lease: released exactly once, by whoever ends the request."""

    def __init__(self, forwarder: Forwarder, desk: AdmissionDesk, lease: Lease) -> None:
        self.forwarder = forwarder
        self.desk = desk
        self.lease = lease
        self.released = False
        self.outcome = "client_gone"  # a stream's, until it ends otherwise

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.forwarder.metrics.leased(-1)
        # Shielded: a release runs to its end even while its caller is being cancelled.
        with anyio.CancelScope(shield=True):
            try:
                await self.forwarder.quick(self.desk.release, self.lease)
            except redis.RedisError:
                # The desk counts this lease until its epoch ends; nothing else can be done.
                self.forwarder.metrics.counts["release_failed"] += 1

    async def apply(self) -> bool:
        return await self.forwarder.quick(self.desk.apply, self.lease)

    async def apply_and_release(self) -> bool:
        """Apply, then release whatever the apply said: one script call at the desk, made
        from the event loop (no worker thread)."""
        self.released = True
        self.forwarder.metrics.leased(-1)
        committed = False
        with anyio.CancelScope(shield=True):
            committed = await self.desk.apply_and_release_async(self.lease)
        return committed

    async def relay(self, response: httpx.Response) -> AsyncGenerator[bytes, None]:
        """The upstream's stream as it comes; the lease is released when it ends, breaks,
        or the caller goes away (the generator is closed or cancelled, or never started:
        then :class:`~runner.gateway.replies.LeasedStream` ends the flight
        itself).

        The stream counts as streamed once its last event (``[DONE]``) has been passed
        on, not only once the upstream's body has ended: the official client stops
        reading at ``[DONE]`` and hangs up, which can come before the body's end
        reaches the gateway, and that caller did get the whole stream. For the same
        reason an upstream that breaks off after its ``[DONE]`` has not broken the
        stream: no error event follows it."""
        tail = b""
        try:
            try:
                async for piece in response.aiter_raw():
                    yield piece
                    tail = (tail + piece)[-_DONE_KEPT:]
                    if _ends_with_done(tail):
                        self.outcome = "streamed"
                self.outcome = "streamed"
            except httpx.HTTPError as exc:
                if self.outcome != "streamed":  # after [DONE] the caller has it all
                    self.outcome = "stream_broken"
                    yield error_event(f"the upstream broke off the stream: {type(exc).__name__}")
        finally:
            await self.end_stream(response)

    async def end_stream(self, response: httpx.Response) -> None:
        """A relayed stream is over, however it ended: close it upstream, release, count."""
        if self.released:
            return
        with anyio.CancelScope(shield=True):
            await response.aclose()
        await self.release()
        self.forwarder.metrics.outcome(self.outcome)

    async def judge_late(self, task: asyncio.Future[httpx.Response]) -> None:
        """Past the local timeout, the lease expired: judge its late answer when it comes,
        and only then give the capacity back (I7)."""
        metrics = self.forwarder.metrics
        try:
            try:
                response = await task
            except httpx.HTTPError:
                metrics.late_failed()
                return
            try:
                if response.status_code >= 300:
                    metrics.late_failed()
                elif await self.forwarder.quick(self.desk.apply, self.lease):
                    metrics.counts["late_commits_BUG"] += 1  # unreachable while the desk holds
            except StaleCompletion:
                metrics.stale()  # the late body: dropped here, never delivered
            finally:
                await _drain(response)
        finally:
            await self.release()

    async def abandon(self, task: asyncio.Future[httpx.Response]) -> None:
        """The caller stopped waiting before the answer: keep the capacity counted until
        the upstream is done (``cancel``), then release."""
        try:
            await self.forwarder.quick(self.desk.cancel, self.lease)
            await _drain(await task)
        except (httpx.HTTPError, redis.RedisError):
            pass
        finally:
            await self.release()
