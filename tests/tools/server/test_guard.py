"""The door's body limit (tools/server/guard.py) as real clients meet it: a body over
the limit is answered 413 too_large naming the limit, and the client receives it, not
a connection reset, however the body is sent (#15)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.toolserver import ToolServer
from tools.server.guard import MAX_BODY_BYTES

BIG = 64 * 1024 * 1024  # the 64 MB write_file body
CHUNK = 1024 * 1024


def big_body() -> Iterator[bytes]:
    yield b'{"envelope": {}, "args": {"path": "big.txt", "content": "'
    for _ in range(BIG // CHUNK):
        yield b"x" * CHUNK
    yield b'"}}'


def assert_too_large(status: int, body: dict[str, object]) -> None:
    assert status == 413 and body["error"] == "too_large", body
    assert str(MAX_BODY_BYTES) in str(body["message"])


def assert_still_serving(toolserver: ToolServer) -> None:
    assert httpx.get(f"{toolserver.url}/healthz", timeout=10).status_code == 200
    assert "Traceback" not in (toolserver.log_dir / "toolserver.out").read_text()


def test_a_streamed_body_over_the_limit_gets_413(toolserver: ToolServer) -> None:
    """Chunked, no Content-Length: the server answers at the chunk past the limit."""
    response = httpx.post(
        f"{toolserver.url}/v1/tools/write_file",
        content=big_body(),
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert_too_large(response.status_code, response.json())
    assert_still_serving(toolserver)


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
def test_a_declared_body_over_the_limit_gets_413(toolserver: ToolServer, connection: str) -> None:
    """Content-Length over the limit: answered before a byte of the body is read, and
    the rest is read before the connection closes, so even a client that asked for
    ``Connection: close`` and is still sending gets the 413 instead of a reset."""
    body = b"".join(big_body())
    response = httpx.post(
        f"{toolserver.url}/v1/tools/write_file",
        content=body,
        headers={"content-type": "application/json", "connection": connection},
        timeout=120,
    )
    assert_too_large(response.status_code, response.json())
    assert_still_serving(toolserver)


def test_urllib_gets_the_413_not_a_reset(toolserver: ToolServer) -> None:
    """urllib sends Connection: close and reads only once the body is sent: the case
    that used to end in ConnectionResetError."""
    request = urllib.request.Request(
        f"{toolserver.url}/v1/tools/write_file",
        data=b"".join(big_body()),
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=120)
    assert_too_large(refused.value.code, json.loads(refused.value.read()))
    assert_still_serving(toolserver)


def test_a_client_expecting_100_continue_is_answered_at_once(toolserver: ToolServer) -> None:
    """Expect: 100-continue with a Content-Length over the limit: the 413 comes before
    any of the body is sent, and the server does not wait for a body that never comes."""
    url = urlsplit(toolserver.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/tools/write_file HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {BIG}\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer
    assert b"too_large" in body
    assert_still_serving(toolserver)
