"""The one OpenAI wire format (runner/agent/openai_wire.py): each writer's output is
what each reader accepts (the strict schema is in
tests/ops/testing/fake_endpoint/test_server.py)."""

from __future__ import annotations

import json

import pytest

from ops.testing.fake_endpoint.plan import (
    INVALID_BODIES,
    FakeEndpointConfig,
    ScriptStep,
    completion_body,
    parse_request,
    request_digest,
)
from ops.testing.harness.loop import classify
from ops.testing.harness.stats import Outcome
from runner.agent import openai_wire as wire
from runner.agent.planners import tool_schemas


def request(*messages: dict[str, object]) -> dict[str, object]:
    return wire.chat_request(
        "fake-model", [wire.user_message("go"), *messages], tools=tool_schemas(), temperature=0
    )


def answer(config: FakeEndpointConfig, body: dict[str, object]) -> bytes:
    parsed = parse_request(json.dumps(body).encode())
    return completion_body(config, parsed, request_digest(parsed), "chatcmpl-1", 0)


def test_a_scripted_tool_call_round_trips() -> None:
    config = FakeEndpointConfig(script=(ScriptStep(tool="read_file", args={"path": "a"}),))
    raw = answer(config, request())
    assert list(json.loads(raw)) == ["id", "object", "created", "model", "choices", "usage"]
    completion = wire.parse_completion(raw)
    [call] = completion.choices[0].message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == ("read_file", {"path": "a"})
    # The planner's next request repeats the call and answers it: the endpoint's next step.
    follow_up = request(
        wire.assistant_message(None, [call]), wire.tool_message(call.id, '{"outcome": "read"}')
    )
    final = wire.parse_completion(answer(config, follow_up))
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content == "script ended after 1 steps"
    assert classify(200, answer(config, follow_up)) == (Outcome.OK, "chatcmpl-1")


def test_an_echo_answer_has_no_tool_calls_key() -> None:
    raw = answer(FakeEndpointConfig(echo_text="ok"), request())
    message = json.loads(raw)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "ok"}
    assert wire.parse_completion(raw).to_wire() == json.loads(raw)


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"id": "x", "choices": []}', *INVALID_BODIES])
def test_what_is_not_a_completion_is_refused_by_every_reader(raw: bytes) -> None:
    with pytest.raises(ValueError):
        wire.parse_completion(raw)
    assert classify(200, raw) == (Outcome.PROTOCOL_ERROR, None)


# -- streaming -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        FakeEndpointConfig(echo_text="several words of text"),
        FakeEndpointConfig(
            script=(ScriptStep(tool="write_file", args={"path": "a", "content": "b"}),)
        ),
    ],
    ids=["text", "tool-call"],
)
def test_the_chunks_of_a_completion_add_up_to_it(config: FakeEndpointConfig) -> None:
    """What the fake streams, read back as a client joins it, is the completion itself."""
    completion = wire.parse_completion(answer(config, request()))
    chunks = wire.completion_chunks(completion, include_usage=True)
    assert {c.id for c in chunks} == {completion.id}
    raw = b"".join(wire.sse_event(c) for c in chunks) + wire.SSE_DONE
    joined = wire.assemble_chunks(wire.parse_sse(raw))
    assert joined.to_wire() == completion.to_wire()
    first = json.loads(wire.sse_event(chunks[0]).removeprefix(b"data: "))
    assert list(first) == ["id", "object", "created", "model", "choices"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1].choices == [] and chunks[-1].usage == completion.usage


def test_a_stream_without_chunks_is_refused() -> None:
    with pytest.raises(ValueError):
        wire.assemble_chunks(wire.parse_sse(wire.SSE_DONE))
    with pytest.raises(ValueError):
        list(wire.parse_sse(b'data: {"id": 1}\n\n'))
