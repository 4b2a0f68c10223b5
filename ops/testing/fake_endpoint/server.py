"""A fault-injecting OpenAI-compatible chat-completions server for tests, the demo and the harness.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /healthz``, ``GET /stats``.
Faults (all seeded, see :mod:`ops.testing.fake_endpoint.plan`): a
concurrency limit answered with 429 and
``Retry-After``; a lognormal service time with an optional slow mixture (concurrent
responses finish out of order); hangs that answer long after any client timeout (a late
body); 5xx; empty or schema-invalid 200 bodies; a retry served the earlier completion
again (same ``id``). Every response carries ``x-service-time-ms``, the endpoint's own
clock from arrival to reply, so a harness can split its clocks.

``"stream": true`` is answered with server-sent ``chat.completion.chunk`` events, one
HTTP chunk each, written as they are made (``transfer-encoding: chunked``); the
request stays counted as open and in service until its last event is written. A
fault answers a stream as it would any request (a 5xx is JSON; an empty body is a
stream that ends at once; an invalid body is its one event).

It is the stdlib threaded HTTP server: one thread per connection, no event loop to
share with the caller, and :func:`serve` runs it in a thread for tests.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ops.testing.fake_endpoint.endpoint import FakeEndpoint, Reply, json_headers
from ops.testing.fake_endpoint.plan import FakeEndpointConfig, error_body

__all__ = ["FakeEndpointServer", "make_server", "serve"]

MAX_BODY_BYTES = 8 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a closed-loop client reuses its connection
    # Headers and body are two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms) and the fake would measure TCP, not its service time.
    disable_nagle_algorithm = True
    server: FakeEndpointServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the load harness would otherwise drown the terminal."""

    def _send(self, reply: Reply) -> None:
        if reply.events is not None:
            self._stream(reply, reply.events)
            return
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

    def _stream(self, reply: Reply, events: list[bytes]) -> None:
        """One HTTP chunk per event, each written as soon as it is made.

        What the stream holds open (``on_sent``) is closed just before its last event
        is written, as a whole reply's is before it is written: a client that sends
        its next request the moment it reads the end must find this one counted
        closed (a gateway then admits the next within its bound).
        """
        closed = False
        endpoint = self.server.endpoint

        def close() -> None:
            nonlocal closed
            if not closed and reply.on_sent is not None:
                reply.on_sent()
            closed = True

        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            if endpoint.stream_breaks(0, len(events)):
                self.close_connection = True  # broken off: no end of body
                return
            for i, event in enumerate(events):
                if i == len(events) - 1:
                    close()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                if i == 0:
                    endpoint.stream_paused()
                if endpoint.stream_breaks(i + 1, len(events)):
                    self.close_connection = True  # broken off: no end of body
                    return
            close()  # a stream of no events
            endpoint.stream_ending()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-stream
        finally:
            close()

    def _json(self, status: int, payload: Any) -> None:
        self._send(Reply(status, json.dumps(payload).encode(), json_headers()))

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
                Reply(404, error_body(f"no route {path}", "invalid_request_error"), json_headers())
            )

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        try:
            length = int(self.headers.get("content-length", ""))
        except ValueError:
            self.close_connection = True
            message = "a request body with content-length is required"
            self._send(Reply(411, error_body(message, "invalid_request_error"), json_headers()))
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            message = f"request body must be at most {MAX_BODY_BYTES} bytes"
            self._send(Reply(413, error_body(message, "invalid_request_error"), json_headers()))
            return
        raw = self.rfile.read(length)
        if path != "/v1/chat/completions":
            self._send(
                Reply(404, error_body(f"no route {path}", "invalid_request_error"), json_headers())
            )
            return
        self._send(self.server.endpoint.chat(raw, self.headers.get("authorization")))


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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset) between requests is not an error of the fake."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

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
