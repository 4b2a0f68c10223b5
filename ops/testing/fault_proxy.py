"""A fault-injecting HTTP proxy for the tool server: real network faults, on demand.

It sits between the workers and the tool server and, for the requests a rule
matches, does what a bad network, an overloaded server or a dying worker does:

* ``lose_response`` -- forwards the request, lets the effect happen, then closes the
  connection without a reply ("executed, then timed out");
* ``status_429`` -- answers 429 with ``Retry-After`` without forwarding (a rate limit);
* ``status_503`` -- answers 503 without forwarding;
* ``delay`` -- forwards, then holds the reply for ``delay_s`` (a slow tail / timeout);
* ``kill_before_send`` -- SIGKILLs the caller (the pid in its ``x-slotrunner-pid``
  header) and drops the request: the call never reaches the server;
* ``kill_before_reply`` -- forwards (the effect happens), SIGKILLs the caller, drops
  the reply;
* ``kill_after_reply`` -- replies, then SIGKILLs the caller (it dies with the reply in
  hand, before it can record or acknowledge anything);
* ``hook`` -- no fault of its own: only the rule's ``before``/``after`` callbacks run
  (the chaos campaign pauses workers, arms crashes and fails fsyncs from them).

Rules match on method and path prefix, optionally on fields of the request's
envelope and on a part of its idempotency key, and fire a bounded number of times,
so a test or the chaos campaign knows exactly what it injected (``stats``).

A connect error to the upstream (a tool server being restarted) is retried for up
to ``upstream_wait_s``, as a load balancer would: nothing was sent, so a second try
cannot apply anything twice (I4). An upstream that dies mid-request drops the
caller's connection, as a real network does.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import httpx

from runner.core.poll import PollTimeout, poll_until
from tools.client import PID_HEADER

Fault = Literal[
    "lose_response",
    "status_429",
    "status_503",
    "delay",
    "kill_before_send",
    "kill_before_reply",
    "kill_after_reply",
    "hook",
]
KILLS = frozenset({"kill_before_send", "kill_before_reply", "kill_after_reply"})
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
_CONNECT_RETRY_S = 0.05


@dataclass(frozen=True)
class Call:
    """One request as the proxy saw it."""

    method: str
    path: str
    body: bytes
    caller_pid: int | None
    envelope: dict[str, Any]  # {} when the body carries none

    @classmethod
    def parse(cls, method: str, path: str, body: bytes, pid_header: str | None) -> Call:
        envelope: dict[str, Any] = {}
        try:
            payload = json.loads(body) if body[:1] == b"{" else None
        except ValueError:
            payload = None
        if isinstance(payload, dict) and isinstance(payload.get("envelope"), dict):
            envelope = payload["envelope"]
        pid = int(pid_header) if pid_header and pid_header.isdigit() else None
        return cls(method, path, body, pid, envelope)

    @property
    def key(self) -> str:
        return str(self.envelope.get("idempotency_key") or "")


@dataclass
class Rule:
    fault: Fault
    path_prefix: str
    method: str = "POST"
    times: int = 1
    retry_after_s: int = 1
    delay_s: float = 0.0
    envelope: dict[str, Any] = field(default_factory=dict)  # fields the envelope must equal
    key_contains: str | None = None  # a part the idempotency key must contain
    before: Callable[[Call], None] | None = None  # runs first when the rule fires
    # after the upstream answered (its status; 0 when it died first, 502 when unreachable)
    after: Callable[[Call, int], None] | None = None
    fired: int = 0

    def matches(self, call: Call) -> bool:
        return (
            self.fired < self.times
            and call.method == self.method
            and call.path.startswith(self.path_prefix)
            and all(call.envelope.get(k) == v for k, v in self.envelope.items())
            and (self.key_contains is None or self.key_contains in call.key)
        )


class _Dropped(Exception):
    """The upstream connection died mid-request: drop the caller's connection too."""


@dataclass
class FaultProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    # SIGKILLs a caller's pid; the kill faults need it (the caller decides which pids
    # may be killed: the proxy trusts no header on its own).
    kill: Callable[[int], None] | None = None
    upstream_wait_s: float = 0.0
    # Keep every forwarded POST with its upstream status (the campaign replays them).
    record: bool = False
    recorded: list[tuple[Call, int]] = field(default_factory=list)
    on_fire: Callable[[Rule, Call], None] | None = None
    # Proxies that share Rule objects (one per host of a chaos campaign) share this
    # lock too, so a rule's ``times`` bounds its firings over all of them.
    lock: threading.Lock | None = None

    def __post_init__(self) -> None:
        self._lock = self.lock or threading.Lock()
        self._client = httpx.Client(base_url=self.upstream, timeout=120.0)
        self._server: ThreadingHTTPServer | None = None

    def add(self, rule: Rule) -> Rule:
        if rule.fault in KILLS and self.kill is None:
            raise ValueError(f"a {rule.fault} rule needs a proxy built with kill=")
        with self._lock:
            self.rules.append(rule)
        return rule

    def _pick(self, call: Call) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(call):
                    rule.fired += 1
                    self.stats[rule.fault] += 1
                    break
            else:
                return None
        if self.on_fire is not None:
            self.on_fire(rule, call)
        return rule

    def _kill(self, call: Call) -> None:
        if self.kill is not None and call.caller_pid is not None:
            self.kill(call.caller_pid)

    def _forward(self, call: Call, headers: dict[str, str]) -> httpx.Response | None:
        """The upstream's answer; None when it stayed unreachable for upstream_wait_s."""

        def answered() -> httpx.Response | None:
            try:
                return self._client.request(
                    call.method, call.path, content=call.body, headers=headers
                )
            except httpx.ConnectError:
                return None  # down (restarting): ask again
            except httpx.TransportError as exc:
                raise _Dropped(str(exc)) from exc

        try:
            return poll_until(answered, self.upstream_wait_s, _CONNECT_RETRY_S)
        except PollTimeout:
            return None

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def handle(self) -> None:
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError):
                    # A caller killed between two requests on a kept-alive connection.
                    self.close_connection = True

            def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                call = Call.parse(self.command, self.path, body, self.headers.get(PID_HEADER))
                rule = proxy._pick(call)
                fault = rule.fault if rule is not None else None
                if rule is not None and rule.before is not None:
                    rule.before(call)
                if fault in ("status_429", "status_503"):
                    assert rule is not None
                    extra = (
                        {"Retry-After": str(rule.retry_after_s)} if fault == "status_429" else {}
                    )
                    payload = b'{"error":"injected","message":"injected by the fault proxy"}'
                    status = 429 if fault == "status_429" else 503
                    self._send(status, payload, {**extra, "Content-Type": "application/json"})
                    return
                if fault == "kill_before_send":
                    proxy._kill(call)
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                after = rule.after if rule is not None else None
                try:
                    upstream = proxy._forward(call, headers)
                except _Dropped:
                    if after is not None:
                        after(call, 0)  # 0: the upstream died before it answered
                    raise
                if upstream is None:
                    if after is not None:
                        after(call, 502)
                    payload = b'{"error":"bad_gateway","message":"the tool server is unreachable"}'
                    self._send(502, payload, {"Content-Type": "application/json"})
                    return
                if proxy.record and call.method == "POST":
                    with proxy._lock:
                        proxy.recorded.append((call, upstream.status_code))
                if after is not None:
                    after(call, upstream.status_code)
                if fault in ("lose_response", "kill_before_reply"):
                    # The effect happened upstream; the caller never hears of it.
                    if fault == "kill_before_reply":
                        proxy._kill(call)
                    self.close_connection = True
                    return
                if fault == "delay":
                    assert rule is not None
                    time.sleep(rule.delay_s)
                reply = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
                self._send(upstream.status_code, upstream.content, reply)
                if fault == "kill_after_reply":
                    proxy._kill(call)

            def _safe(self) -> None:
                try:
                    self._handle()
                except (BrokenPipeError, ConnectionResetError, _Dropped):
                    # The caller gave up (a timeout it was meant to hit), or the upstream
                    # died mid-call: nothing to send.
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
