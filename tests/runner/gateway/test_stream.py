"""Streams through the admission gateway (runner/gateway/): passed through chunk by chunk
to the official ``openai`` client, the lease held until the stream ends or its caller
goes away."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from runner.core.settings import Settings
from tests.support.gateway import Gateway, client, desk_stats, new_run, upstream

HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def gateway(settings: Settings, redis_client: redis.Redis) -> Iterator[Gateway]:
    gw = Gateway.in_process(settings, redis_client)
    yield gw
    gw.stop()


@pytest.fixture
def endpoint() -> Iterator[tuple[FakeEndpointServer, str]]:
    config = FakeEndpointConfig(
        service_ms_median=2.0, service_ms_p99=5.0, echo_text="one two three four"
    )
    server, port = serve(config)
    yield server, upstream(port)
    server.close()


def stream(agent: Any, **extra: Any) -> Any:
    return agent.chat.completions.create(model="fake-model", messages=HI, stream=True, **extra)


def test_a_stream_arrives_chunk_by_chunk_and_holds_its_lease_to_the_end(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """The upstream pauses after its first event: the agent already has that chunk (so
    nothing is buffered), the desk and the upstream each count the request as open;
    once the stream is read to its end the lease is back."""
    server, url = endpoint
    run = new_run()
    agent = client(gateway.mint(url, eval_run=run, bound=2))
    server.endpoint.pause_streams()
    chunks = stream(agent, stream_options={"include_usage": True})
    try:
        first = next(iter(chunks))
        assert first.choices[0].delta.role == "assistant"
        assert desk_stats(gateway.redis, run, 2)["in_flight"] == 1
        assert server.endpoint.stats()["requests_open"] == 1
    finally:
        server.endpoint.resume_streams()
    rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert text == "one two three four"
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 4
    gateway.wait_for(lambda g: g["outcomes"]["streamed"] == 1 and g["leases_held"] == 0)
    stats = desk_stats(gateway.redis, run, 2)
    assert stats["in_flight"] == 0 and stats["committed"] == 1 and stats["released"] == 1


def test_a_caller_that_hangs_up_at_done_has_had_its_whole_stream(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """The official client stops reading at ``[DONE]`` and closes the connection; the
    upstream holds the end of its body past that. Every event was passed on, so the
    stream counts as streamed, not as a caller gone, and its lease is back."""
    server, url = endpoint
    run = new_run()
    agent = client(gateway.mint(url, eval_run=run, bound=1))
    server.endpoint.hold_stream_ends()
    try:
        assert stream_text(stream(agent)) == "one two three four"
        # The gateway's relay is still waiting for the upstream's end when the client
        # has gone: the hang-up is seen there, with the end of the body held back.
        gateway.wait_for(lambda g: g["leases_held"] == 0)
    finally:
        server.endpoint.release_stream_ends()
    gateway.wait_for(lambda g: g["outcomes"]["streamed"] == 1 and g["leases_held"] == 0)
    assert gateway.outcomes()["client_gone"] == 0
    stats = desk_stats(gateway.redis, run, 1)
    assert stats["in_flight"] == 0 and stats["committed"] == 1 and stats["released"] == 1


def test_an_upstream_that_breaks_off_mid_stream_ends_it_with_an_error_event(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """The upstream drops its connection after its first event: the agent gets that
    chunk, then the error event, which the official client raises; the stream counts
    as broken and its lease is back."""
    server, url = endpoint
    run = new_run()
    agent = client(gateway.mint(url, eval_run=run, bound=1))
    server.endpoint.break_streams(after_events=1)
    chunks = iter(stream(agent))
    first = next(chunks)
    assert first.choices[0].delta.role == "assistant"
    with pytest.raises(openai.APIError, match="the upstream broke off the stream"):
        next(chunks)
    gateway.wait_for(lambda g: g["outcomes"]["stream_broken"] == 1 and g["leases_held"] == 0)
    assert gateway.outcomes()["streamed"] == 0
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0


def test_an_upstream_that_breaks_off_after_done_has_streamed_it_whole(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """Every event, ``[DONE]`` last, then the upstream drops its connection before the
    end of its body. A caller that reads to the end of the gateway's body (not the
    official client, which stops at ``[DONE]``) finds ``[DONE]`` last and no error
    event after it; the stream counts as streamed, not broken."""
    server, url = endpoint
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=1)
    server.endpoint.break_streams(after_events=10**6)  # past its last event
    body = {"model": "fake-model", "messages": HI, "stream": True}
    headers = {"authorization": f"Bearer {credential.secret}"}
    with httpx.stream(
        "POST", f"{credential.gateway_url}/chat/completions", json=body, headers=headers
    ) as reply:
        assert reply.status_code == 200
        raw = b"".join(reply.iter_raw())
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b'"error"' not in raw
    gateway.wait_for(lambda g: g["outcomes"]["streamed"] == 1 and g["leases_held"] == 0)
    assert gateway.outcomes()["stream_broken"] == 0
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0


def test_a_caller_that_goes_away_mid_stream_gives_its_lease_back(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    server, url = endpoint
    run = new_run()
    agent = client(gateway.mint(url, eval_run=run, bound=1))
    server.endpoint.pause_streams()
    try:
        chunks = stream(agent)
        next(iter(chunks))
        chunks.close()  # the agent hangs up while the upstream is still streaming
        gateway.wait_for(lambda g: g["outcomes"]["client_gone"] == 1 and g["leases_held"] == 0)
    finally:
        server.endpoint.resume_streams()
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0
    # The capacity really is back: the run's one lease serves the next request.
    assert stream_text(stream(agent)) == "one two three four"


def stream_text(chunks: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_streamed_tool_call_adds_up_to_the_same_call_as_without_streaming(
    gateway: Gateway, redis_client: redis.Redis
) -> None:
    script = (ScriptStep(tool="write_file", args={"path": "a.txt", "content": "x" * 40}),)
    server, port = serve(
        FakeEndpointConfig(service_ms_median=2.0, service_ms_p99=5.0, script=script)
    )
    try:
        agent = client(gateway.mint(upstream(port), eval_run=new_run(), bound=1))
        whole = agent.chat.completions.create(model="fake-model", messages=HI)
        [expected] = whole.choices[0].message.tool_calls or []
        assert isinstance(expected, ChatCompletionMessageFunctionToolCall)
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in stream(agent):
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += call.id or ""
                    if call.function is not None:
                        entry["name"] += call.function.name or ""
                        entry["arguments"] += call.function.arguments or ""
        assert finish == "tool_calls"
        # The call id follows the request, and "stream" is part of it; the call is the same.
        [call] = calls.values()
        assert call["id"].startswith("call_0_") and list(calls) == [0]
        assert (call["name"], call["arguments"]) == (
            expected.function.name,
            expected.function.arguments,
        )
    finally:
        server.close()


def test_an_upstream_error_before_a_stream_starts_is_a_502_not_a_broken_stream(
    gateway: Gateway, redis_client: redis.Redis
) -> None:
    server, port = serve(
        FakeEndpointConfig(service_ms_median=2.0, service_ms_p99=5.0, error_prob=1)
    )
    try:
        run = new_run()
        agent = client(gateway.mint(upstream(port), eval_run=run, bound=1))
        with pytest.raises(openai.InternalServerError) as failed:
            stream(agent)
        assert failed.value.status_code == 502
        assert desk_stats(redis_client, run, 1)["in_flight"] == 0
    finally:
        server.close()


def test_a_caller_gone_before_the_first_byte_still_gives_its_lease_back(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """The agent gives up while the upstream has not even answered; the upstream then
    answers with a stream nobody reads: its lease is released (whether the gateway saw
    the caller leave before the stream began, or only while writing it)."""
    server, url = endpoint
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=1)
    server.endpoint.hold()
    try:
        with pytest.raises(openai.APITimeoutError):
            stream(client(credential, timeout=0.5))
    finally:
        server.endpoint.release()
    gateway.wait_for(
        lambda g: (
            g["outcomes"]["client_gone"] + g["outcomes"]["streamed"] == 1 and g["leases_held"] == 0
        )
    )
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0
    server.endpoint.wait_for(lambda s: s["requests_open"] == 0, 10)


def test_a_late_stream_holds_its_lease_until_the_upstream_has_sent_it_all(
    gateway: Gateway, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """A stream past the local timeout: the caller has its 504, the late stream is judged
    stale at its first bytes, and its capacity comes back only at its end, when the
    upstream is done with it. Closed at once instead, the run's next request would be
    admitted while the upstream still streams the late one: two open under a bound of
    one, as the upstream counts them (I6)."""
    server, url = endpoint
    run = new_run()
    credential = gateway.mint(
        url, eval_run=run, bound=1, request_timeout_s=0.3, admission_wait_s=0.5
    )
    agent = client(credential)
    server.endpoint.hold()  # the upstream keeps the request past the local timeout
    server.endpoint.pause_streams()
    try:
        with pytest.raises(openai.InternalServerError) as timed_out:
            stream(agent)
        assert timed_out.value.status_code == 504
        server.endpoint.release()  # the late stream starts, and pauses after one event
        gateway.wait_for(lambda g: g["stale_completions"] == 1)
        # The upstream is still streaming it: the run's one lease is still taken.
        with pytest.raises(openai.RateLimitError):
            agent.chat.completions.create(model="fake-model", messages=HI)
        assert server.endpoint.stats()["requests_open"] == 1
    finally:
        server.endpoint.release()
        server.endpoint.resume_streams()
    gateway.wait_for(lambda g: g["leases_held"] == 0)
    counted = server.endpoint.stats()
    assert counted["max_requests_open_seen"] == 1 and counted["requests_open"] == 0
    assert stream_text(stream(agent)) == "one two three four"  # the capacity is back
