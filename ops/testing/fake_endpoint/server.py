"""A fault-injecting OpenAI-compatible chat-completions server for tests, the demo and the harness.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /healthz``, ``GET /stats``.
Faults (all seeded, see :mod:`ops.testing.fake_endpoint.plan`): a
concurrency limit answered with 429 and
``Retry-After``; a lognormal service time with an optional slow mixture (concurrent
responses finish out of order); hangs that answer long after any client timeout (a late
body); 5xx; empty or schema-invalid 200 bodies; a retry served the earlier completion
again (same ``id``). Every response carries ``x-service-time-ms``, the endpoint's own
clock from arrival to reply, so a harness can split its clocks.

It is the stdlib threaded HTTP server: one thread per connection, no event loop to
share with the caller, and :func:`serve` runs it in a thread for tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ops.testing.fake_endpoint.plan import (
    FakeEndpointConfig,
    Fault,
    RequestError,
    completion_body,
    error_body,
    parse_request,
    plan_request,
    request_digest,
)

__all__ = ["FakeEndpoint", "FakeEndpointConfig", "FakeEndpointServer", "make_server", "serve"]

MAX_BODY_BYTES = 8 * 1024 * 1024
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


def _json_headers() -> dict[str, str]:
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
        self._seen: OrderedDict[str, tuple[int, bytes | None]] = OrderedDict()
        self._service_ms: deque[float] = deque(maxlen=SERVICE_SAMPLES)
        self._counts = dict.fromkeys(
            (
                "requests",
                "answered_429",
                "answered_400",
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

    def stop(self) -> None:
        """End every wait now (hangs, holds), so shutdown does not wait for them."""
        self._stop.set()
        self._gate.set()

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

    def chat(self, raw: bytes) -> Reply:
        """Answer one ``POST /v1/chat/completions``; ``x-service-time-ms`` is set here."""
        started = time.perf_counter()
        with self._changed:
            self.requests_open += 1
            self.max_requests_open_seen = max(self.max_requests_open_seen, self.requests_open)
            self._changed.notify_all()
        try:
            reply = self._chat(raw)
        finally:
            # Closed before the reply is written, like in_flight: the window counted
            # lies inside the client's own wait for this reply.
            with self._changed:
                self.requests_open -= 1
                self._changed.notify_all()
        service_ms = (time.perf_counter() - started) * 1000
        reply.headers[SERVICE_HEADER] = f"{service_ms:.3f}"
        reply.headers[FAULT_HEADER] = reply.fault.value
        if reply.status != 429:
            with self._lock:
                self._service_ms.append(service_ms)
        return reply

    def _chat(self, raw: bytes) -> Reply:
        self._count("requests")
        try:
            request = parse_request(raw)
        except RequestError as exc:
            self._count("answered_400")
            return Reply(400, error_body(str(exc), "invalid_request_error"), _json_headers())
        if not self._admit():
            message = f"concurrency limit of {self.config.max_concurrency} requests reached"
            headers = {**_json_headers(), "retry-after": str(self.config.retry_after_s)}
            return Reply(429, error_body(message, "rate_limit_exceeded", "rate_limit"), headers)
        try:
            return self._serve_admitted(request)
        finally:
            # Capacity returns before the reply is written: a client that sends its next
            # request the moment it reads this reply must find the slot free.
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

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
                _json_headers(),
                fault,
            )
        if fault is Fault.EMPTY:
            self._count("empty_injected")
            return Reply(200, b"", _json_headers(), fault)
        if fault is Fault.INVALID:
            self._count("invalid_injected")
            return Reply(200, plan.invalid_body, _json_headers(), fault)
        self._count("late_bodies" if fault is Fault.HANG else "completed")
        return Reply(200, body, _json_headers(), fault)

    def models(self) -> dict[str, Any]:
        entry = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "slotrunner"}
        return {"object": "list", "data": [entry]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a closed-loop client reuses its connection
    # Headers and body are two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms) and the fake would measure TCP, not its service time.
    disable_nagle_algorithm = True
    server: FakeEndpointServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the load harness would otherwise drown the terminal."""

    def _send(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout it was meant to hit): a late body, unheard.
            self.close_connection = True

    def _json(self, status: int, payload: Any) -> None:
        self._send(Reply(status, json.dumps(payload).encode(), _json_headers()))

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        endpoint = self.server.endpoint
        if path == "/healthz":
            self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            self._json(200, endpoint.models())
        elif path == "/stats":
            self._json(200, endpoint.stats())
        else:
            self._send(
                Reply(404, error_body(f"no route {path}", "invalid_request_error"), _json_headers())
            )

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        try:
            length = int(self.headers.get("content-length", ""))
        except ValueError:
            self.close_connection = True
            message = "a request body with content-length is required"
            self._send(Reply(411, error_body(message, "invalid_request_error"), _json_headers()))
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            message = f"request body must be at most {MAX_BODY_BYTES} bytes"
            self._send(Reply(413, error_body(message, "invalid_request_error"), _json_headers()))
            return
        raw = self.rfile.read(length)
        if path != "/v1/chat/completions":
            self._send(
                Reply(404, error_body(f"no route {path}", "invalid_request_error"), _json_headers())
            )
            return
        self._send(self.server.endpoint.chat(raw))


class FakeEndpointServer(ThreadingHTTPServer):
    """The HTTP server; ``close()`` ends hangs and holds, stops serving, frees the port."""

    daemon_threads = True  # a hung handler must never keep the process alive
    request_queue_size = 256  # a sweep opens many connections at once; 5 would drop SYNs

    def __init__(self, config: FakeEndpointConfig, host: str, port: int) -> None:
        self.endpoint = FakeEndpoint(config)
        self._serving = False
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        super().serve_forever(poll_interval)

    def close(self) -> None:
        self.endpoint.stop()
        if self._serving:
            self.shutdown()
        self.server_close()

    def __exit__(self, *args: object) -> None:
        self.close()


def make_server(
    config: FakeEndpointConfig, host: str = "127.0.0.1", port: int = 0
) -> FakeEndpointServer:
    """A bound, not yet serving, fake endpoint (``port=0``: a free port)."""
    return FakeEndpointServer(config, host, port)


def serve(
    config: FakeEndpointConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[FakeEndpointServer, int]:
    """Start a fake endpoint in a daemon thread: the server (``close()`` it) and its port."""
    server = make_server(config, host, port)
    server._serving = True  # set before the thread runs, so an early close() still shuts down
    # A short poll interval: close() (shutdown) waits up to one interval.
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name=f"fake-endpoint-{server.port}", daemon=True
    )
    thread.start()
    return server, server.port
