"""One chat-completion request forwarded upstream under an admission lease of its run.

The lease comes from the eval-run's desk (``runner/admission/desk.py``), the same desk
and the same four steps as the openai planner (``runner/agent/planners.py``), so
requests of the gateway and of the planner share one bound (I6):

- *acquire* before anything is sent, waiting up to the grant's admission wait; a
  refusal is a 429 with ``Retry-After``, and nothing reaches the upstream.
- the local timeout (the grant's ``request_timeout_s``) *expires* the lease: the caller
  gets a 504, the request is left running (the upstream may still answer), its
  capacity stays counted, and when the late answer arrives it is judged at the desk
  (``apply`` refuses it as ``stale_completion``), counted, and dropped. It had its own
  connection and its own task: no later request can be handed it.
- an answer in time is *applied* (committed iff its lease is still live) before a
  byte of it is passed on; a stream is applied at its first byte and holds its lease
  until its last, or until the caller goes away.
- *release* once the upstream is done with the request: at once for an answer, a 429
  (the capacity goes back, the 429 is passed on with its ``Retry-After``) or an error
  (a 5xx or a failed connection is a 502), at the end of a stream, after a late
  answer was judged and, if it is a stream, read to its end and dropped.

The credential check, the acquire (a caller waiting for capacity polls the desk with
``asyncio.sleep``, holding no thread) and the apply-and-release of a whole answer
(one script call) are made from the event loop on an asyncio Redis client of the same
server: each thread hop costs wake-ups on the critical path. The other desk calls
(expire, release, cancel, a stream's apply) are blocking Redis calls off the
critical path of an answer, so they run in a pool of worker threads of their own
(docs/architecture.md §Gateway).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx
import redis
import redis.asyncio
from starlette.responses import Response

from runner.admission.desk import DEFAULT_MAX_WAITING, AdmissionDesk
from runner.admission.lease import (
    AdmissionRefused,
    DeskMismatch,
    Lease,
    RefusalReason,
    StaleCompletion,
)
from runner.agent import openai_wire as wire
from runner.gateway.credentials import Authenticator, Caller, Grant
from runner.gateway.flight import Flight
from runner.gateway.metrics import GatewayMetrics
from runner.gateway.replies import LeasedStream, error, is_event_stream, passed_headers

T = TypeVar("T")

# As the openai planner: a timed-out request is left this long to answer late.
HTTP_TIMEOUT_FACTOR = 20
MIN_HTTP_TIMEOUT_S = 60.0
RECOVERY_GRACE_S = 30.0  # beyond the HTTP timeout, for a finished request's release
CONNECT_TIMEOUT_S = 10.0
STEP_BITS = 53  # each request is its own desk step, drawn at random
QUICK_THREADS = 64  # release, expire, cancel, the apply of a stream, stats


def http_timeout_s(grant: Grant) -> float:
    """How long one request may stay out: a timed-out one is left to answer late."""
    return max(grant.request_timeout_s * HTTP_TIMEOUT_FACTOR, MIN_HTTP_TIMEOUT_S)


class Forwarder:
    """The gateway's requests, each under a lease of its eval-run's desk."""

    def __init__(
        self,
        redis_client: redis.Redis,
        aio_redis: redis.asyncio.Redis,
        http: httpx.AsyncClient,
        metrics: GatewayMetrics,
        *,
        home: Path | None,
        api_keys: Mapping[str, str],
        retry_after_s: int = 1,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        self.redis = redis_client
        self.aio_redis = aio_redis  # the same server, for the calls made on the loop
        self.http = http
        self.metrics = metrics
        self.home = home
        self.api_keys = api_keys
        self.retry_after_s = retry_after_s
        self.max_waiting = max_waiting
        self._desks: dict[tuple[str, int, float], AdmissionDesk] = {}
        # Made here, inside the running loop (anyio's limiters belong to one).
        self._quick = anyio.CapacityLimiter(QUICK_THREADS)
        self._background: set[asyncio.Task[None]] = set()
        self._authenticate = Authenticator(aio_redis)

    # -- threads and background work -----------------------------------------------

    async def quick(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._quick)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: let late answers be judged, up to ``timeout_s``, then stop."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(set(self._background), timeout=5.0)

    # -- desks --------------------------------------------------------------------------

    def desk(self, grant: Grant) -> AdmissionDesk:
        hold_s = http_timeout_s(grant) + RECOVERY_GRACE_S
        key = (grant.eval_run, grant.bound, hold_s)
        desk = self._desks.get(key)
        if desk is None:
            desk = self._desks[key] = AdmissionDesk(
                self.redis,
                grant.eval_run,
                grant.bound,
                home=self.home,
                recovery_hold_s=hold_s,
                max_waiting=self.max_waiting,
                aio_client=self.aio_redis,
            )
        return desk

    def desks(self) -> dict[str, AdmissionDesk]:
        """One desk object per eval-run this gateway has served."""
        return {desk.eval_run: desk for desk in self._desks.values()}

    async def authenticate(self, secret: str) -> Caller | None:
        return await self._authenticate(secret)

    # -- one request --------------------------------------------------------------------

    def upstream_headers(self, grant: Grant, stream: bool) -> dict[str, str] | None:
        """The headers sent upstream: never the agent's, the gateway's key if the grant
        names one; None when the gateway does not have that key."""
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "accept-encoding": "identity",  # passed on byte for byte, never re-encoded
            "user-agent": "slotrunner-gateway",
        }
        if grant.api_key_env is not None:
            key = self.api_keys.get(grant.api_key_env)
            if not key:
                return None
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def chat(self, caller: Caller, raw: bytes, stream: bool) -> Response:
        """Forward ``raw`` (a chat-completions body) under a lease (module docstring)."""
        grant = caller.grant
        headers = self.upstream_headers(grant, stream)
        if headers is None:
            self.metrics.outcome("misconfigured")
            message = f"the gateway has no upstream key in ${grant.api_key_env}"
            return error(500, message, "server_error", "upstream_key_missing")
        desk = self.desk(grant)
        started = time.monotonic()
        try:
            lease = await self._acquire(desk, max(0.0, min(grant.admission_wait_s, caller.ttl_s)))
        except AdmissionRefused as exc:
            self.metrics.refused(exc.reason.value)
            return await self._refusal(desk, exc)
        except DeskMismatch as exc:
            self.metrics.outcome("desk_error")
            return error(500, str(exc), "server_error", "desk_mismatch")
        except redis.RedisError:
            self.metrics.outcome("desk_error")
            retry = {"retry-after": str(self.retry_after_s)}
            return error(503, "the admission desk is unreachable", "server_error", "desk", retry)
        self.metrics.admission_wait_s.observe(time.monotonic() - started)
        flight = Flight(self, desk, lease)
        url = grant.upstream + wire.ROUTE
        timeout = httpx.Timeout(http_timeout_s(grant), connect=CONNECT_TIMEOUT_S)
        request = self.http.build_request(
            "POST", url, content=raw, headers=headers, timeout=timeout
        )
        task = asyncio.ensure_future(self.http.send(request, stream=stream))
        try:
            done, _ = await asyncio.wait({task}, timeout=grant.request_timeout_s)
        except asyncio.CancelledError:
            self.spawn(flight.abandon(task))  # the answer is no longer wanted
            raise
        if not done:
            self.metrics.outcome("timeout")
            # Fenced before the caller hears of it, so its retry cannot race the late body.
            try:
                await self.quick(desk.expire, lease)
            finally:
                self.spawn(flight.judge_late(task))
            message = f"no answer from the upstream within {grant.request_timeout_s:g}s"
            return error(504, message, "timeout", "local_timeout")
        try:
            return await self._answer(flight, task.result(), stream)
        except httpx.HTTPError as exc:
            await flight.release()
            self.metrics.outcome("upstream_unreachable")
            message = f"the upstream could not be reached: {type(exc).__name__}: {exc}"
            return error(502, message, "upstream_error", "upstream_unreachable")
        except BaseException:
            await flight.release()
            raise

    async def _acquire(self, desk: AdmissionDesk, wait_s: float) -> Lease:
        step = secrets.randbits(STEP_BITS)
        # Shielded: a lease granted while the caller was being cancelled must still be
        # seen here, to be given back (the caller's next await is cancelled, and its
        # flight abandons the lease), not lost between the desk's reply and the caller.
        with anyio.CancelScope(shield=True):
            lease = await desk.acquire_async(step, wait_s)
        self.metrics.leased(+1)
        return lease

    async def _refusal(self, desk: AdmissionDesk, exc: AdmissionRefused) -> Response:
        retry_s = self.retry_after_s
        if exc.reason is RefusalReason.RECOVERING:
            hold_ms = (await self.quick(desk.stats))["recovery_hold_left_ms"]
            retry_s = max(retry_s, -(-hold_ms // 1000))
        retry = {"retry-after": str(retry_s)}
        return error(429, str(exc), "rate_limit_exceeded", f"admission_{exc.reason.value}", retry)

    async def _answer(self, flight: Flight, response: httpx.Response, stream: bool) -> Response:
        status = response.status_code
        headers = passed_headers(response.headers)
        relay = stream and status < 300 and is_event_stream(response)
        if not relay:
            try:
                body = await response.aread()
            finally:
                await response.aclose()
        if status == 429:
            await flight.release()
            self.metrics.outcome("upstream_429")
            return Response(body, 429, headers=headers)
        if status >= 500:
            await flight.release()
            self.metrics.outcome("upstream_5xx")
            message = f"the upstream answered {status}"
            return error(502, message, "upstream_error", f"upstream_{status}")
        if status >= 300:
            await flight.release()
            self.metrics.outcome("upstream_4xx")
            return Response(body, status, headers=headers)
        # The answer counts only if its lease is still live; a whole body is applied and
        # released in one go, before the reply, so the caller's next request finds the
        # capacity free; a stream keeps its lease to its end.
        try:
            committed = await (flight.apply() if relay else flight.apply_and_release())
        except StaleCompletion:
            committed = False
            self.metrics.stale()
        if not committed:  # not live any more (the desk was lost meanwhile): never passed on
            if relay:
                await response.aclose()
            await flight.release()
            self.metrics.outcome("stale")
            return error(502, "the answer's lease was not live", "upstream_error", "stale")
        if relay:
            ended = functools.partial(flight.end_stream, response)
            return LeasedStream(flight.relay(response), status, headers, ended)
        self.metrics.outcome("completed")
        return Response(body, status, headers=headers)
