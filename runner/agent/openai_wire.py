"""The OpenAI chat-completions wire format, written down once (docs/architecture.md).

Four parts of slotrunner speak it: the openai planner (``runner.agent.planners``)
builds requests and reads completions, the fake endpoint
(``ops.testing.fake_endpoint``) reads requests and writes completions, streamed
chunks and errors, the load harness (``ops.testing.harness``) builds requests and
reads completions, and the admission gateway (``runner.gateway``) writes errors. All
of them use the models and builders here, so a field cannot be spelled one way by
the writer and another by the reader.

A streamed answer (``"stream": true``) is server-sent events: one ``data: <chunk>``
event per ``chat.completion.chunk``, then ``data: [DONE]``
(:func:`completion_chunks`, :func:`sse_event`, :data:`SSE_DONE`).

The models accept keys they do not name (a real server sends more than slotrunner
reads); the builders write exactly the keys shown, in the order shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict

ROUTE = "/chat/completions"  # under the API's base URL, e.g. http://host:port/v1


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Wire):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(_Wire):
    id: str
    type: str = "function"
    function: FunctionCall


class Message(_Wire):
    """The assistant's message of a completion: text, or tool calls (content None)."""

    role: str
    content: str | None = None
    tool_calls: list[ToolCall] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            wire["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return wire


class Choice(_Wire):
    index: int = 0
    message: Message
    logprobs: Any = None
    finish_reason: str | None = None


class Usage(_Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def _object_wire(
    id_: str, object_: str, created: int, model: str, choices: list[Any], usage: Usage | None
) -> dict[str, Any]:
    """A completion or chunk object, keys in the order OpenAI writes them."""
    wire: dict[str, Any] = {
        "id": id_,
        "object": object_,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        wire["usage"] = usage.model_dump()
    return wire


class ChatCompletion(_Wire):
    """A ``chat.completion`` object: what ``POST .../chat/completions`` answers."""

    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[Choice]
    usage: Usage | None = None

    def to_wire(self) -> dict[str, Any]:
        choices = [
            {
                "index": c.index,
                "message": c.message.to_wire(),
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in self.choices
        ]
        return _object_wire(self.id, self.object, self.created, self.model, choices, self.usage)


def parse_completion(raw: bytes) -> ChatCompletion:
    """The completion in a response body; ValueError when it is not one with a choice."""
    completion = ChatCompletion.model_validate_json(raw)  # ValidationError is a ValueError
    if not completion.choices:
        raise ValueError("a chat completion without choices")
    return completion


# -- requests -------------------------------------------------------------------------


def chat_request(
    model: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """The body of ``POST .../chat/completions``."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools is not None:
        body["tools"] = tools
    if temperature is not None:
        body["temperature"] = temperature
    return body


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """One entry of a request's ``tools``: a function the model may call."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def user_message(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant_message(content: str | None, tool_calls: list[ToolCall]) -> dict[str, Any]:
    """The assistant's turn as the next request repeats it."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [call.model_dump() for call in tool_calls],
    }


def tool_message(tool_call_id: str, content: str) -> dict[str, Any]:
    """A tool call's result, answering the call of that id."""
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


def error_object(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object a failed request is answered with."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# -- streaming ------------------------------------------------------------------------

SSE_DONE = b"data: [DONE]\n\n"  # the event that ends a stream of chunks


class ChunkFunction(_Wire):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(_Wire):
    """A piece of a tool call: the first names it (id, name), the next carry arguments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: ChunkFunction | None = None


class Delta(_Wire):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


class ChunkChoice(_Wire):
    index: int = 0
    delta: Delta
    logprobs: Any = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Wire):
    """A ``chat.completion.chunk`` object: one event of a streamed answer."""

    id: str
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str = ""
    choices: list[ChunkChoice]
    usage: Usage | None = None

    def to_wire(self) -> dict[str, Any]:
        choices = [
            {
                "index": c.index,
                "delta": c.delta.to_wire(),
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in self.choices
        ]
        return _object_wire(self.id, self.object, self.created, self.model, choices, self.usage)


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def completion_chunks(
    completion: ChatCompletion, *, include_usage: bool = False
) -> list[ChatCompletionChunk]:
    """The chunks a server streams for ``completion`` (its first choice): the role, the
    text a word at a time or each tool call's name then its arguments in two pieces,
    the finish reason, and with ``include_usage`` a last chunk of usage, no choices."""
    choice = completion.choices[0]
    message = choice.message

    def chunk(delta: Delta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=completion.id,
            created=completion.created,
            model=completion.model,
            choices=[ChunkChoice(index=choice.index, delta=delta, finish_reason=finish_reason)],
        )

    chunks = [chunk(Delta(role=message.role, content=""))]
    words = (message.content or "").split(" ")
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        if piece:
            chunks.append(chunk(Delta(content=piece)))
    for index, call in enumerate(message.tool_calls or []):
        named = ChunkToolCall(
            index=index,
            id=call.id,
            type=call.type,
            function=ChunkFunction(name=call.function.name, arguments=""),
        )
        chunks.append(chunk(Delta(tool_calls=[named])))
        for piece in _halves(call.function.arguments):
            part = ChunkToolCall(index=index, function=ChunkFunction(arguments=piece))
            chunks.append(chunk(Delta(tool_calls=[part])))
    chunks.append(chunk(Delta(), choice.finish_reason or "stop"))
    if include_usage and completion.usage is not None:
        chunks.append(
            ChatCompletionChunk(
                id=completion.id,
                created=completion.created,
                model=completion.model,
                choices=[],
                usage=completion.usage,
            )
        )
    return chunks


def sse_event(chunk: ChatCompletionChunk) -> bytes:
    """One server-sent event carrying ``chunk``."""
    return b"data: " + json.dumps(chunk.to_wire(), separators=(",", ":")).encode() + b"\n\n"


def parse_sse(raw: bytes) -> Iterator[ChatCompletionChunk]:
    """The chunks of a whole event stream, up to ``[DONE]``; ValueError on one that is
    not a chunk."""
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            continue
        if data == b"[DONE]":
            return
        yield ChatCompletionChunk.model_validate_json(data)


def assemble_chunks(chunks: Iterable[ChatCompletionChunk]) -> ChatCompletion:
    """The completion a stream of chunks adds up to (its first choice), as a client
    joins them; ValueError when there are none."""
    first: ChatCompletionChunk | None = None
    role, content, finish, usage = "assistant", "", None, None
    calls: dict[int, dict[str, str]] = {}
    for piece in chunks:
        first = first or piece
        usage = piece.usage or usage
        for choice in piece.choices[:1]:
            delta = choice.delta
            role = delta.role or role
            content += delta.content or ""
            finish = choice.finish_reason or finish
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
    if first is None:
        raise ValueError("a stream without chunks")
    tool_calls = [
        ToolCall(id=c["id"], function=FunctionCall(name=c["name"], arguments=c["arguments"]))
        for _, c in sorted(calls.items())
    ]
    message = Message(role=role, content=content or None, tool_calls=tool_calls or None)
    return ChatCompletion(
        id=first.id,
        created=first.created,
        model=first.model,
        choices=[Choice(message=message, finish_reason=finish)],
        usage=usage,
    )
