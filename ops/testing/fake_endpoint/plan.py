"""What the fake OpenAI endpoint answers, decided without I/O.

Every fault is drawn from a generator seeded by ``(seed, request digest, occurrence)``:
the same request arriving for the n-th time gets the same fate on every run with the
same seed, whatever order concurrent requests arrive in. A retry is the same request
body again, so it is the next occurrence: it may fail differently, or (duplicate fault)
be served the very completion, same ``id``, that an earlier attempt was given.
The step of a scripted conversation is the number of ``role: "tool"`` messages, so a
retry of a request is answered with the same step. A request with ``"stream": true``
gets the same completion as server-sent chunks (:func:`stream_events`); its fate is
drawn the same way (the ``stream`` flag is part of the request, so of its digest).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ops.errors import OpsError
from runner.agent import openai_wire as wire

Z_P99 = 2.3263478740408408  # standard normal quantile of 0.99
ERROR_STATUSES = (500, 502, 503)
# Bodies a broken proxy or server might send with a 200: truncated, missing choices, wrong types.
INVALID_BODIES = (
    b'{"id": "chatcmpl-trunc", "object": "chat.completion", "choices": [{"index": 0, "mess',
    b'{"object": "chat.completion", "created": 0, "model": "fake"}',
    b'{"id": 7, "object": "chat.completion", "choices": [{"index": 0, "message": null}]}',
)


class Fault(StrEnum):
    NONE = "none"
    ERROR = "error"  # a 5xx
    HANG = "hang"  # answered only after hang_s: a late body
    EMPTY = "empty"  # 200 with no body
    INVALID = "invalid"  # 200 with a body that is not a chat completion
    DUPLICATE = "duplicate"  # a retry served the earlier completion again, same id


class ScriptStep(BaseModel):
    """One scripted answer: a tool call ``{"tool", "args"}`` or a final text ``{"final"}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str | None = Field(default=None, min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    final: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptStep:
        if (self.tool is None) == (self.final is None):
            raise ValueError('a step is either {"tool": NAME, "args": {...}} or {"final": TEXT}')
        if self.final is not None and self.args:
            raise ValueError('a "final" step takes no "args"')
        return self


class FakeEndpointConfig(BaseModel):
    """Every knob of the fake endpoint; probabilities are per admitted request."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = 0
    model: str = Field(default="fake-model", min_length=1)
    api_key: str | None = Field(default=None, min_length=1)  # None: no key required
    script: tuple[ScriptStep, ...] | None = None  # None: echo mode
    echo_text: str = "ok"
    max_concurrency: int = Field(default=0, ge=0)  # 0: unlimited
    retry_after_s: int = Field(default=1, ge=0)
    service_ms_median: float = Field(default=50.0, gt=0)
    service_ms_p99: float = Field(default=150.0, gt=0)
    slow_prob: float = Field(default=0.0, ge=0, le=1)
    slow_ms: float = Field(default=1000.0, ge=0)
    hang_prob: float = Field(default=0.0, ge=0, le=1)
    hang_s: float = Field(default=30.0, ge=0)
    error_prob: float = Field(default=0.0, ge=0, le=1)
    empty_prob: float = Field(default=0.0, ge=0, le=1)
    invalid_prob: float = Field(default=0.0, ge=0, le=1)
    duplicate_prob: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _coherent(self) -> FakeEndpointConfig:
        if self.service_ms_p99 < self.service_ms_median:
            raise ValueError("service_ms_p99 must be at least service_ms_median")
        total = self.error_prob + self.hang_prob + self.empty_prob + self.invalid_prob
        if total > 1.0:
            raise ValueError(
                f"error_prob + hang_prob + empty_prob + invalid_prob is {total:g}; must be <= 1"
            )
        if self.script is not None and not self.script:
            raise ValueError("script must hold at least one step")
        return self


@dataclass(frozen=True)
class Plan:
    """The fate of one admitted request."""

    fault: Fault  # NONE here may still become DUPLICATE if an earlier body exists
    duplicate: bool  # serve the cached body of this request, if there is one
    service_ms: float
    error_status: int
    invalid_body: bytes
    completion_id: str


class RequestError(OpsError):
    """The request is not a chat-completions request this endpoint can answer (HTTP 400)."""


def parse_request(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or RequestError naming the field at fault."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise RequestError(f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise RequestError("model: must be a non-empty string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}]: must be an object with a string role")
    if not isinstance(body.get("stream", False), bool):
        raise RequestError("stream: must be true or false")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and body.get("stream")):
        raise RequestError("stream_options: must be an object, and only with stream: true")
    if body.get("n", 1) != 1:
        raise RequestError("n: only n=1 is supported")
    if "tools" in body and not isinstance(body["tools"], list):
        raise RequestError("tools: must be a list")
    return body


def request_digest(body: dict[str, Any]) -> str:
    """Identity of a request: a retry sends the same body, so it has the same digest."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _sigma(config: FakeEndpointConfig) -> float:
    return math.log(config.service_ms_p99 / config.service_ms_median) / Z_P99


def plan_request(config: FakeEndpointConfig, digest: str, occurrence: int) -> Plan:
    """The fate of the ``occurrence``-th admitted arrival (1-based) of the request ``digest``."""
    key = f"{config.seed}/{digest}/{occurrence}"
    rng = random.Random(key)
    # Fixed draw order: changing one probability never shifts the other draws.
    u_fault, u_dup, u_slow = rng.random(), rng.random(), rng.random()
    z = rng.gauss(0.0, 1.0)
    error_status = rng.choice(ERROR_STATUSES)
    invalid_body = rng.choice(INVALID_BODIES)
    fault = Fault.NONE
    edge = 0.0
    for candidate, prob in (
        (Fault.ERROR, config.error_prob),
        (Fault.HANG, config.hang_prob),
        (Fault.EMPTY, config.empty_prob),
        (Fault.INVALID, config.invalid_prob),
    ):
        edge += prob
        if u_fault < edge:
            fault = candidate
            break
    if u_slow < config.slow_prob:
        service_ms = config.slow_ms
    else:
        service_ms = config.service_ms_median * math.exp(_sigma(config) * z)
    return Plan(
        fault=fault,
        duplicate=fault is Fault.NONE and occurrence > 1 and u_dup < config.duplicate_prob,
        service_ms=service_ms,
        error_status=error_status,
        invalid_body=invalid_body,
        completion_id="chatcmpl-" + hashlib.sha256(key.encode()).hexdigest()[:24],
    )


def _tokens(text: str) -> int:
    return len(text.split())


def _script_message(
    config: FakeEndpointConfig, body: dict[str, Any], digest: str
) -> tuple[wire.Message, str]:
    assert config.script is not None
    step = sum(1 for m in body["messages"] if m.get("role") == "tool")
    if step >= len(config.script):
        ended = f"script ended after {len(config.script)} steps"
        return wire.Message(role="assistant", content=ended), "stop"
    chosen = config.script[step]
    if chosen.final is not None:
        return wire.Message(role="assistant", content=chosen.final), "stop"
    assert chosen.tool is not None  # a step is a final text or a tool call
    # The call id depends on the conversation, not the attempt: a retry names the same call.
    call_id = f"call_{step}_{hashlib.sha256(f'{config.seed}/{digest}'.encode()).hexdigest()[:12]}"
    arguments = json.dumps(chosen.args, sort_keys=True)
    call = wire.ToolCall(
        id=call_id, function=wire.FunctionCall(name=chosen.tool, arguments=arguments)
    )
    return wire.Message(role="assistant", content=None, tool_calls=[call]), "tool_calls"


def completion_body(
    config: FakeEndpointConfig,
    body: dict[str, Any],
    digest: str,
    completion_id: str,
    created_s: int,
) -> bytes:
    """The OpenAI ``chat.completion`` object answering ``body``."""
    if config.script is None:
        message = wire.Message(role="assistant", content=config.echo_text)
        finish_reason = "stop"
    else:
        message, finish_reason = _script_message(config, body, digest)
    prompt_tokens = sum(
        _tokens(m["content"]) for m in body["messages"] if isinstance(m.get("content"), str)
    )
    answer = message.content or json.dumps(message.to_wire().get("tool_calls", []))
    completion_tokens = _tokens(answer)
    completion = wire.ChatCompletion(
        id=completion_id,
        created=created_s,
        model=body["model"],
        choices=[wire.Choice(message=message, finish_reason=finish_reason)],
        usage=wire.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
    )
    return json.dumps(completion.to_wire()).encode()


def wants_stream(body: dict[str, Any]) -> bool:
    return body.get("stream") is True


def stream_events(body: dict[str, Any], completion: bytes) -> list[bytes]:
    """The server-sent events streaming ``completion`` (a ``chat.completion`` body, as
    :func:`completion_body` wrote it) for the request ``body``, ``[DONE]`` last."""
    options = body.get("stream_options") or {}
    chunks = wire.completion_chunks(
        wire.parse_completion(completion), include_usage=options.get("include_usage") is True
    )
    return [*(wire.sse_event(chunk) for chunk in chunks), wire.SSE_DONE]


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    """The OpenAI error object."""
    return json.dumps(wire.error_object(message, kind, code)).encode()
