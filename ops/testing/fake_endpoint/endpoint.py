"""The fake OpenAI endpoint's state and its answer to one request, without HTTP.

:class:`FakeEndpoint` counts what it serves (``/stats``), draws each request's fate
from its plan (:mod:`ops.testing.fake_endpoint.plan`) and returns a :class:`Reply`
that the HTTP layer (:mod:`ops.testing.fake_endpoint.server`) only writes. Its test
seams hold requests in service (:meth:`FakeEndpoint.hold`), streams after their
first event (:meth:`FakeEndpoint.pause_streams`) or before the end of their body
(:meth:`FakeEndpoint.hold_stream_ends`), or break streams off
(:meth:`FakeEndpoint.break_streams`).
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ops.testing.fake_endpoint.plan import (
    FakeEndpointConfig,
    Fault,
    RequestError,
    completion_body,
    error_body,
    parse_request,
    plan_request,
    request_digest,
    stream_events,
    wants_stream,
)

REMEMBERED_REQUESTS = 50_000  # digests whose occurrence count and body are kept (LRU)
SERVICE_SAMPLES = 10_000  # service times kept for /stats
FAULT_HEADER = "x-fake-fault"  # what was injected; only this fake sends it
SERVICE_HEADER = "x-service-time-ms"


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    fault: Fault = Fault.NONE
    # A stream: the events, written one HTTP chunk each instead of ``body``; then
    # ``on_sent`` closes what the request still holds open.
    events: list[bytes] | None = None
    on_sent: Callable[[], None] | None = None


def _stream_headers() -> dict[str, str]:
    return {"content-type": "text/event-stream", "cache-control": "no-cache"}


def json_headers() -> dict[str, str]:
    return {"content-type": "application/json"}


class FakeEndpoint:
    """The endpoint's state and its answer to one request; the HTTP layer only writes."""

    def __init__(self, config: FakeEndpointConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        # Notified on every change of the counts: tests wait on the endpoint's own state.
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self._stream_gate = threading.Event()
        self._stream_gate.set()
        self._stream_end_gate = threading.Event()
        self._stream_end_gate.set()
        self._break_streams_after: int | None = None
        self._seen: OrderedDict[str, tuple[int, bytes | None]] = OrderedDict()
        self._service_ms: deque[float] = deque(maxlen=SERVICE_SAMPLES)
        self._counts = dict.fromkeys(
            (
                "requests",
                "answered_429",
                "answered_400",
                "answered_401",
                "timeouts_injected",
                "late_bodies",
                "errors_injected",
                "empty_injected",
                "invalid_injected",
                "duplicates_sent",
                "completed",
            ),
            0,
        )
        self.in_flight = 0
        self.max_in_flight_seen = 0
        # Requests between arrival and reply, 429s included: what a client's admission
        # bound is about, counted here, independently of the client's own counter.
        self.requests_open = 0
        self.max_requests_open_seen = 0

    # -- test seams -----------------------------------------------------------------
    def hold(self) -> None:
        """Keep admitted requests in service until :meth:`release` (tests fill the limit)."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def pause_streams(self) -> None:
        """Stop every stream after its first event until :meth:`resume_streams` (tests
        hold a stream open mid-way)."""
        self._stream_gate.clear()

    def resume_streams(self) -> None:
        self._stream_gate.set()

    def stream_paused(self) -> None:
        """Where a stream waits after its first event while streams are paused."""
        self._stream_gate.wait()

    def hold_stream_ends(self) -> None:
        """Write every stream's last event (``[DONE]``) but hold the end of its body
        until :meth:`release_stream_ends` (tests hold the gap between the two, where a
        client that stops reading at ``[DONE]`` hangs up)."""
        self._stream_end_gate.clear()

    def release_stream_ends(self) -> None:
        self._stream_end_gate.set()

    def break_streams(self, after_events: int) -> None:
        """Drop every stream's connection after at most ``after_events`` events, before
        the end of its body, until :meth:`mend_streams` (tests break a stream off
        mid-way, or just after its ``[DONE]`` with a number past its last event)."""
        if after_events < 0:
            raise ValueError(f"after_events must be >= 0, not {after_events}")
        self._break_streams_after = after_events

    def mend_streams(self) -> None:
        self._break_streams_after = None

    def stream_breaks(self, written: int, total: int) -> bool:
        """Whether a stream that has written ``written`` of its ``total`` events is to be
        broken off now."""
        after = self._break_streams_after
        return after is not None and written == min(after, total)

    def stream_ending(self) -> None:
        """Where a stream waits after its last event while stream ends are held."""
        self._stream_end_gate.wait()

    def stop(self) -> None:
        """End every wait now (hangs, holds, paused streams), so shutdown does not wait."""
        self._stop.set()
        self._gate.set()
        self._stream_gate.set()
        self._stream_end_gate.set()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any]:
        """The stats once ``predicate`` holds on them; TimeoutError after ``timeout_s``."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self._stats()), timeout_s):
                raise TimeoutError(f"endpoint state not reached in {timeout_s:g}s: {self._stats()}")
            return self._stats()

    # -- the answer -----------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        return {
            **self._counts,
            "in_flight": self.in_flight,
            "max_in_flight_seen": self.max_in_flight_seen,
            "requests_open": self.requests_open,
            "max_requests_open_seen": self.max_requests_open_seen,
            "max_concurrency": self.config.max_concurrency,
            "service_ms": [round(ms, 3) for ms in self._service_ms],
        }

    def _count(self, name: str) -> None:
        with self._changed:
            self._counts[name] += 1
            self._changed.notify_all()

    def _admit(self) -> bool:
        with self._lock:
            limit = self.config.max_concurrency
            if limit and self.in_flight >= limit:
                self._counts["answered_429"] += 1
                self._changed.notify_all()
                return False
            self.in_flight += 1
            self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)
            self._changed.notify_all()
            return True

    def _occurrence(self, digest: str) -> tuple[int, bytes | None]:
        with self._lock:
            seen, body = self._seen.pop(digest, (0, None))
            self._seen[digest] = (seen + 1, body)
            while len(self._seen) > REMEMBERED_REQUESTS:
                self._seen.popitem(last=False)
            return seen + 1, body

    def _remember(self, digest: str, body: bytes) -> None:
        with self._lock:
            if digest in self._seen:
                self._seen[digest] = (self._seen[digest][0], body)

    def chat(self, raw: bytes, authorization: str | None = None) -> Reply:
        """Answer one ``POST /v1/chat/completions`` (``authorization``: the request's
        header of that name); ``x-service-time-ms`` is set here."""
        started = time.perf_counter()
        with self._changed:
            self.requests_open += 1
            self.max_requests_open_seen = max(self.max_requests_open_seen, self.requests_open)
            self._changed.notify_all()
        reply: Reply | None = None
        try:
            reply = self._chat(raw, authorization)
        finally:
            # Closed before the reply is written, like in_flight: the window counted
            # lies inside the client's own wait for this reply. A stream is open until
            # its last event is written.
            if reply is not None and reply.events is not None:
                reply.on_sent = self._closer(reply.on_sent, "requests_open")
            else:
                self._close("requests_open")
        service_ms = (time.perf_counter() - started) * 1000
        reply.headers[SERVICE_HEADER] = f"{service_ms:.3f}"
        reply.headers[FAULT_HEADER] = reply.fault.value
        if reply.status != 429:
            with self._lock:
                self._service_ms.append(service_ms)
        return reply

    def _close(self, name: str) -> None:
        with self._changed:
            setattr(self, name, getattr(self, name) - 1)
            self._changed.notify_all()

    def _closer(self, then: Callable[[], None] | None, name: str) -> Callable[[], None]:
        def close() -> None:
            if then is not None:
                then()
            self._close(name)

        return close

    def _chat(self, raw: bytes, authorization: str | None) -> Reply:
        self._count("requests")
        key = self.config.api_key
        if key is not None and not hmac.compare_digest(authorization or "", f"Bearer {key}"):
            self._count("answered_401")
            message = "missing or wrong API key (Authorization: Bearer ...)"
            body = error_body(message, "invalid_request_error", "invalid_api_key")
            return Reply(401, body, json_headers())
        try:
            request = parse_request(raw)
        except RequestError as exc:
            self._count("answered_400")
            return Reply(400, error_body(str(exc), "invalid_request_error"), json_headers())
        if not self._admit():
            message = f"concurrency limit of {self.config.max_concurrency} requests reached"
            headers = {**json_headers(), "retry-after": str(self.config.retry_after_s)}
            return Reply(429, error_body(message, "rate_limit_exceeded", "rate_limit"), headers)
        reply: Reply | None = None
        try:
            reply = self._serve_admitted(request)
            return reply
        finally:
            # Capacity returns before the reply is written: a client that sends its next
            # request the moment it reads this reply must find the slot free. A stream
            # is in service until its last event is written.
            if reply is not None and reply.events is not None:
                reply.on_sent = self._closer(reply.on_sent, "in_flight")
            else:
                self._close("in_flight")

    def _serve_admitted(self, request: dict[str, Any]) -> Reply:
        digest = request_digest(request)
        occurrence, earlier = self._occurrence(digest)
        plan = plan_request(self.config, digest, occurrence)
        fault = plan.fault
        if plan.duplicate and earlier is not None:
            fault, body = Fault.DUPLICATE, earlier
            self._count("duplicates_sent")
        else:
            created_s = int(time.time())
            body = completion_body(self.config, request, digest, plan.completion_id, created_s)
            if fault in (Fault.NONE, Fault.HANG):
                # Remembered before the wait: a retry racing a hung original can be
                # handed the completion the original will also deliver, late.
                self._remember(digest, body)
        if fault is Fault.HANG:
            self._count("timeouts_injected")
        # The stop event is the sleep: close() ends a 30 s hang at once.
        self._stop.wait(self.config.hang_s if fault is Fault.HANG else plan.service_ms / 1000)
        self._gate.wait()
        if fault is Fault.ERROR:
            self._count("errors_injected")
            return Reply(
                plan.error_status,
                error_body("injected server error", "server_error"),
                json_headers(),
                fault,
            )
        stream = wants_stream(request)
        if fault is Fault.EMPTY:
            self._count("empty_injected")
            if stream:
                return Reply(200, b"", _stream_headers(), fault, events=[])
            return Reply(200, b"", json_headers(), fault)
        if fault is Fault.INVALID:
            self._count("invalid_injected")
            if stream:
                event = b"data: " + plan.invalid_body + b"\n\n"
                return Reply(200, b"", _stream_headers(), fault, events=[event])
            return Reply(200, plan.invalid_body, json_headers(), fault)
        self._count("late_bodies" if fault is Fault.HANG else "completed")
        if stream:
            return Reply(200, b"", _stream_headers(), fault, events=stream_events(request, body))
        return Reply(200, body, json_headers(), fault)

    def models(self) -> dict[str, Any]:
        entry = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "slotrunner"}
        return {"object": "list", "data": [entry]}
