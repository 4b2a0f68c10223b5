"""A fault-injecting HTTP proxy for the tool server: real network faults, on demand.

It sits between the workers and the tool server and, for the requests a rule
matches, does what a bad network or an overloaded server does:

* ``lose_response`` -- forwards the request, lets the effect happen, then closes the
  connection without a reply ("executed, then timed out");
* ``status_429`` -- answers 429 with ``Retry-After`` without forwarding (a rate limit);
* ``status_503`` -- answers 503 without forwarding;
* ``delay`` -- forwards, then holds the reply for ``delay_s`` (a slow tail / timeout).

Rules match on method and path prefix and fire a bounded number of times, so a test
or the chaos campaign knows exactly what it injected (``stats``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import httpx

Fault = Literal["lose_response", "status_429", "status_503", "delay"]
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Rule:
    fault: Fault
    path_prefix: str
    method: str = "POST"
    times: int = 1
    retry_after_s: int = 1
    delay_s: float = 0.0
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (
            self.fired < self.times and method == self.method and path.startswith(self.path_prefix)
        )


@dataclass
class FaultProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._client = httpx.Client(base_url=self.upstream, timeout=120.0)
        self._server: ThreadingHTTPServer | None = None

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def _pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.fired += 1
                    self.stats[rule.fault] += 1
                    return rule
        return None

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                rule = proxy._pick(self.command, self.path)
                if rule is not None and rule.fault in ("status_429", "status_503"):
                    status = 429 if rule.fault == "status_429" else 503
                    payload = b'{"error":"injected","message":"injected by the fault proxy"}'
                    self.send_response(status)
                    if status == 429:
                        self.send_header("Retry-After", str(rule.retry_after_s))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                upstream = proxy._client.request(
                    self.command, self.path, content=body, headers=headers
                )
                if rule is not None and rule.fault == "lose_response":
                    # The effect happened upstream; the caller never hears of it.
                    self.close_connection = True
                    return
                if rule is not None and rule.fault == "delay":
                    time.sleep(rule.delay_s)
                self.send_response(upstream.status_code)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

            def _safe(self) -> None:
                try:
                    self._handle()
                except (BrokenPipeError, ConnectionResetError):
                    # The caller gave up (a timeout it was meant to hit); nothing to send.
                    self.close_connection = True

            do_GET = do_POST = _safe

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://{host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._client.close()
