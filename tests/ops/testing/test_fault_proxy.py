"""The fault proxy's rules for the campaign: kills, hooks, matching, a restarting upstream."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from ops.testing.fault_proxy import Call, FaultProxy, Rule
from ops.testing.stack import free_port
from tools.client import PID_HEADER, ToolClient
from tools.envelope import Envelope


class Upstream:
    """A real HTTP server that answers 200 with a count, or hangs up on /drop."""

    def __init__(self, port: int = 0) -> None:
        seen = self.seen = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                seen.append(self.path)
                if self.path.startswith("/drop"):
                    self.close_connection = True
                    return
                body = json.dumps({"n": len(seen)}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    try:
        yield server
    finally:
        server.stop()


def body(job_id: str, key: str | None) -> dict[str, object]:
    return {"envelope": {"job_id": job_id, "tool": "write_file", "idempotency_key": key}}


def post(url: str, path: str, payload: dict[str, object], pid: int = 4242) -> httpx.Response:
    return httpx.post(url + path, json=payload, headers={PID_HEADER: str(pid)}, timeout=10)


def test_rule_matches_its_job_and_step_only(upstream: Upstream) -> None:
    """A rule naming a job and a key part fires only on that call, and only `times` times."""
    proxy = FaultProxy(upstream.url)
    rule = proxy.add(
        Rule("status_429", "/v1/tools/write_file", envelope={"job_id": "A"}, key_contains=":s2:")
    )
    url = proxy.start()
    try:
        other_job = post(url, "/v1/tools/write_file", body("B", "B:a1:s2:write_file"))
        other_step = post(url, "/v1/tools/write_file", body("A", "A:a1:s3:write_file"))
        hit = post(url, "/v1/tools/write_file", body("A", "A:a1:s2:write_file"))
        again = post(url, "/v1/tools/write_file", body("A", "A:a2:s2:write_file"))
    finally:
        proxy.stop()
    assert [r.status_code for r in (other_job, other_step, hit, again)] == [200, 200, 429, 200]
    assert hit.headers["retry-after"] == "1" and rule.fired == 1
    assert len(upstream.seen) == 3


@pytest.mark.parametrize(
    ("fault", "forwarded", "answered"),
    [
        ("kill_before_send", False, False),
        ("kill_before_reply", True, False),
        ("kill_after_reply", True, True),
    ],
)
def test_kill_rules_kill_the_caller_at_their_point(
    upstream: Upstream, fault: str, forwarded: bool, answered: bool
) -> None:
    """The caller's pid (from its header) is killed before sending, before or after the reply."""
    killed: list[int] = []
    proxy = FaultProxy(upstream.url, kill=killed.append)
    proxy.add(Rule(fault, "/v1/tools/"))  # type: ignore[arg-type]
    url = proxy.start()
    try:
        try:
            reply: httpx.Response | None = post(url, "/v1/tools/write_file", body("A", "k"), 777)
        except httpx.TransportError:
            reply = None
    finally:
        proxy.stop()
    assert killed == [777]
    assert (len(upstream.seen) == 1) is forwarded
    assert (reply is not None and reply.status_code == 200) is answered


def test_a_kill_rule_needs_a_killer(upstream: Upstream) -> None:
    """A proxy built without kill= refuses a kill rule instead of ignoring it."""
    with pytest.raises(ValueError, match="kill="):
        FaultProxy(upstream.url).add(Rule("kill_before_send", "/"))


def test_hooks_see_the_call_and_the_upstream_status(upstream: Upstream) -> None:
    """before runs ahead of forwarding; after gets the status, 0 when the upstream hung up."""
    seen: list[tuple[str, object]] = []

    def before(call: Call) -> None:
        seen.append(("before", call.envelope["job_id"]))

    def after(call: Call, status: int) -> None:
        seen.append(("after", status))

    proxy = FaultProxy(upstream.url, record=True)
    proxy.add(Rule("hook", "/v1/", before=before, after=after, times=1))
    proxy.add(Rule("hook", "/drop", after=after, times=1))
    url = proxy.start()
    try:
        ok = post(url, "/v1/tools/write_file", body("A", "k1"))
        # The proxy hangs up as its upstream did: not a refused connect or a timeout.
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            post(url, "/drop", body("A", "k2"))
    finally:
        proxy.stop()
    assert ok.status_code == 200
    assert seen == [("before", "A"), ("after", 200), ("after", 0)]
    assert [(c.caller_pid, c.key, status) for c, status in proxy.recorded] == [(4242, "k1", 200)]


def test_a_restarting_upstream_is_waited_for() -> None:
    """Connect errors are retried for upstream_wait_s (nothing was sent), then 502."""
    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}", upstream_wait_s=30.0)
    url = proxy.start()
    replies: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: replies.append(post(url, "/v1/tools/x", body("A", "k")))
    )
    sender.start()
    upstream = Upstream(port)  # comes up while the request waits in the proxy
    try:
        sender.join(timeout=30)
        assert [r.status_code for r in replies] == [200]
    finally:
        upstream.stop()
        proxy.stop()
    nobody = FaultProxy(f"http://127.0.0.1:{free_port()}", upstream_wait_s=0.0)
    url = nobody.start()
    try:
        gone = post(url, "/v1/tools/x", body("A", "k"))
    finally:
        nobody.stop()
    assert gone.status_code == 502 and gone.json()["error"] == "bad_gateway"


def test_tool_client_names_its_process(upstream: Upstream) -> None:
    """Every request of the tool client carries the pid of the process that sent it."""
    proxy = FaultProxy(upstream.url, record=True)
    url = proxy.start()
    client = ToolClient(url)
    try:
        envelope = Envelope(job_id="A", attempt=1, slot_id="S0", generation=1, tool="read_file")
        client.call(envelope, {"path": "x"})
    finally:
        client.close()
        proxy.stop()
    assert [c.caller_pid for c, _ in proxy.recorded] == [os.getpid()]
