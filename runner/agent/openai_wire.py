"""The OpenAI chat-completions wire format, written down once (docs/architecture.md).

Three parts of slotrunner speak it: the openai planner (``runner.agent.planners``)
builds requests and reads completions, the fake endpoint
(``ops.testing.fake_endpoint``) reads requests and writes completions and errors, and
the load harness (``ops.testing.harness``) builds requests and reads completions. All
of them use the models and builders here, so a field cannot be spelled one way by
the writer and another by the reader.

The models accept keys they do not name (a real server sends more than slotrunner
reads); the builders write exactly the keys shown, in the order shown.
"""

from __future__ import annotations

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


class ChatCompletion(_Wire):
    """A ``chat.completion`` object: what ``POST .../chat/completions`` answers."""

    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[Choice]
    usage: Usage | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": c.index,
                    "message": c.message.to_wire(),
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ],
        }
        if self.usage is not None:
            wire["usage"] = self.usage.model_dump()
        return wire


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
