"""The fake endpoint's ``"stream": true`` (ops/testing/fake_endpoint/): server-sent
chunks the official ``openai`` client parses, written one by one, counted while open."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from runner.agent import openai_wire as wire

FAST = {"service_ms_median": 1.0, "service_ms_p99": 3.0}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def start() -> Iterator[Callable[..., tuple[FakeEndpointServer, openai.OpenAI]]]:
    servers: list[FakeEndpointServer] = []

    def _start(**knobs: Any) -> tuple[FakeEndpointServer, openai.OpenAI]:
        server, port = serve(FakeEndpointConfig(**{**FAST, **knobs}))
        servers.append(server)
        agent = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        return server, agent

    yield _start
    for server in servers:
        server.close()


def test_the_official_client_reads_a_streamed_text(start: Any) -> None:
    _, agent = start(echo_text="a streamed answer")
    chunks = list(
        agent.chat.completions.create(
            model="fake-model", messages=HI, stream=True, stream_options={"include_usage": True}
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len(
        {c.id for c in chunks}
    ) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a streamed answer"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_a_stream_is_the_same_completion_as_the_whole_body(start: Any) -> None:
    """Joined, the chunks are the completion the same request gets unstreamed."""
    script = (ScriptStep(tool="apply_patch", args={"patch": "--- a\n+++ b\n" * 5}),)
    server, _ = start(script=script)
    base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    body = {"model": "fake-model", "messages": HI}
    whole = wire.parse_completion(httpx.post(base, json=body).content)
    streamed = httpx.post(base, json={**body, "stream": True})
    assert streamed.headers["content-type"] == "text/event-stream"
    assert streamed.content.endswith(wire.SSE_DONE)
    joined = wire.assemble_chunks(wire.parse_sse(streamed.content))
    [call] = joined.choices[0].message.tool_calls or []
    [expected] = whole.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (
        expected.function.name,
        expected.function.arguments,
    )
    assert joined.choices[0].finish_reason == "tool_calls"


def test_a_stream_is_written_event_by_event_and_counted_open_to_its_end(start: Any) -> None:
    server, agent = start()
    server.endpoint.pause_streams()
    chunks = agent.chat.completions.create(model="fake-model", messages=HI, stream=True)
    try:
        first = next(iter(chunks))  # written before the rest exists on the wire
        assert first.choices[0].delta.role == "assistant"
        counted = server.endpoint.stats()
        assert counted["requests_open"] == 1 and counted["in_flight"] == 1
    finally:
        server.endpoint.resume_streams()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    server.endpoint.wait_for(lambda s: s["requests_open"] == 0 and s["in_flight"] == 0, 10)


def test_a_stream_is_counted_closed_before_its_client_has_read_it_all(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that has read a stream to its end finds it counted closed: the count
    closes before the last event is written, as a whole reply's does. A gateway that
    releases its lease at a stream's end must never see one more open than its bound
    (tests/e2e/test_gateway.py counted 5 of 4 when the count closed after the end).

    The endpoint's closing is made slow here (it waits up to 0.5 s for the client to
    have read everything): closed after the end, the client would read the end first
    and count the stream still open; closed before it, the end waits for the close.
    """
    server, _ = start()
    client_has_all = threading.Event()
    close = server.endpoint._close

    def slow_close(name: str) -> None:
        client_has_all.wait(0.5)
        close(name)

    monkeypatch.setattr(server.endpoint, "_close", slow_close)
    body = {"model": "fake-model", "messages": HI, "stream": True}
    base = f"http://127.0.0.1:{server.port}"
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body) as streamed:
        text = b"".join(streamed.iter_bytes())
    counted = httpx.get(f"{base}/stats").json()  # its own connection: no queue behind the stream
    client_has_all.set()
    assert text.endswith(wire.SSE_DONE)
    assert (counted["requests_open"], counted["in_flight"]) == (0, 0)


def test_a_stream_counts_against_the_concurrency_limit_until_it_ends(start: Any) -> None:
    server, agent = start(max_concurrency=1)
    server.endpoint.pause_streams()
    chunks = agent.chat.completions.create(model="fake-model", messages=HI, stream=True)
    try:
        next(iter(chunks))
        with pytest.raises(openai.RateLimitError):
            agent.chat.completions.create(model="fake-model", messages=HI)
    finally:
        server.endpoint.resume_streams()
    list(chunks)


def test_faults_answer_a_stream_too(start: Any) -> None:
    _, failing = start(error_prob=1.0)
    with pytest.raises(openai.InternalServerError):
        failing.chat.completions.create(model="fake-model", messages=HI, stream=True)
    empty_server, empty = start(empty_prob=1.0)
    assert list(empty.chat.completions.create(model="fake-model", messages=HI, stream=True)) == []
    assert empty_server.endpoint.stats()["empty_injected"] == 1


def test_close_ends_a_paused_stream(start: Any) -> None:
    server, agent = start()
    server.endpoint.pause_streams()
    chunks = agent.chat.completions.create(model="fake-model", messages=HI, stream=True)
    next(iter(chunks))
    reader = threading.Thread(target=lambda: list(chunks))
    reader.start()
    server.close()
    reader.join(10)
    assert not reader.is_alive()


STREAM = {"model": "fake-model", "messages": HI, "stream": True}


def completions(server: FakeEndpointServer) -> str:
    return f"http://127.0.0.1:{server.port}/v1/chat/completions"


def read_until_broken(server: FakeEndpointServer) -> bytes:
    """A stream's bytes up to where its connection was dropped (it must be dropped)."""
    got = b""
    with (
        httpx.stream("POST", completions(server), json=STREAM) as reply,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        for piece in reply.iter_raw():
            got += piece
    return got


def test_a_broken_stream_stops_after_its_events_without_an_end_of_body(start: Any) -> None:
    """``break_streams(after_events=N)``: N events, then the connection is dropped
    mid-body (a client sees an incomplete chunked body); mended, streams end whole."""
    server, _ = start(echo_text="one two three")
    server.endpoint.break_streams(after_events=2)
    got = read_until_broken(server)
    assert got.count(b"data: ") == 2 and wire.SSE_DONE not in got
    server.endpoint.break_streams(after_events=10**6)  # every event, then no end
    assert read_until_broken(server).endswith(wire.SSE_DONE)
    server.endpoint.mend_streams()
    assert httpx.post(completions(server), json=STREAM).content.endswith(wire.SSE_DONE)
    with pytest.raises(ValueError, match="after_events"):
        server.endpoint.break_streams(after_events=-1)


def test_a_held_stream_end_comes_after_its_done_on_release(start: Any) -> None:
    """``hold_stream_ends``: every event, ``[DONE]`` last, is written; the end of the
    body waits for ``release_stream_ends``."""
    server, _ = start(echo_text="one two")
    server.endpoint.hold_stream_ends()
    got = b""
    with httpx.stream("POST", completions(server), json=STREAM) as reply:
        pieces = reply.iter_raw()
        while not got.endswith(wire.SSE_DONE):
            got += next(pieces)
        ended = threading.Event()

        def rest() -> None:
            for _ in pieces:
                pass
            ended.set()

        reader = threading.Thread(target=rest)
        reader.start()
        assert not ended.wait(0.3)  # the body is held open after [DONE]
        server.endpoint.release_stream_ends()
        reader.join(10)
    assert ended.is_set()
