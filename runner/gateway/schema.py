"""The admission gateway's OpenAPI document (``GET /openapi.json``), from its wire models.

The bodies are the OpenAI wire format's models (``runner/agent/openai_wire.py``) and
the OpenAI error object every refusal of the gateway is (``runner/gateway/replies.py``);
the statuses are those of docs/architecture.md §Gateway. A request body is passed on
byte for byte: the gateway itself only needs a JSON object, the upstream judges the
rest, and an upstream's own 4xx is passed on as it came.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from runner.agent import openai_wire as wire
from tools.server.guard import TOKEN_HEADER


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_exceeded, upstream_error, …")
    param: Any = None
    code: str | None = Field(
        description="invalid_api_key, superseded, too_large, admission_<reason>, …"
    )


class ErrorBody(BaseModel):
    """An OpenAI error object: how the gateway refuses, so clients report it as usual."""

    error: ErrorDetail


class ChatRequest(BaseModel):
    """What an OpenAI client sends; forwarded to the run's upstream unchanged."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    stream: bool = Field(default=False, description="true: server-sent events, relayed")


class Health(BaseModel):
    ok: bool
    host: str


_REF = "#/components/schemas/{model}"
_RETRY_AFTER = {"Retry-After": {"required": True, "schema": {"type": "integer", "minimum": 0}}}


def _error(description: str, **extra: Any) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}}
    return {"description": description, "content": content, **extra}


def _json(model: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}},
    }


def _credential_errors() -> dict[str, Any]:
    return {
        "401": _error(
            "no gateway credential, or an unknown, expired or revoked one (nothing sent)",
            headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
        ),
        "403": _error("superseded: the job has moved past this credential's attempt"),
        "500": _error("the gateway lacks the upstream key the grant names, or the desk differs"),
        "503": _error("the credentials or the desk cannot be reached now", headers=_RETRY_AFTER),
    }


def _chat_completions() -> dict[str, Any]:
    completion = _json("ChatCompletion", "the upstream's completion, under a lease of the run")
    completion["content"]["text/event-stream"] = {
        "schema": {"type": "string", "description": "data: <chat.completion.chunk> events"}
    }
    return {
        "post": {
            "operationId": "chat_completions",
            "summary": "A chat completion, forwarded under a lease of the run's desk",
            "security": [{"agentCredential": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": _REF.format(model="ChatRequest")}}
                },
            },
            "responses": {
                "200": completion,
                "400": _error("the body is not a JSON object"),
                "413": _error("too_large: the body is over the gateway's limit"),
                "429": _error(
                    "admission_<reason>: no lease within the wait (nothing sent), or the "
                    "upstream's own 429",
                    headers=_RETRY_AFTER,
                ),
                "502": _error("the upstream failed (5xx), could not be reached, or went stale"),
                "504": _error("local_timeout: no answer within the grant's request_timeout_s"),
                "4XX": {"description": "another 4xx of the upstream, passed on as it came"},
                **_credential_errors(),
            },
        }
    }


def _ops(summary: str, ok: dict[str, Any], *, token: bool) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": {"200": ok}}
    if token:
        operation["security"] = [{"serverToken": []}, {"serverBearer": []}]
        operation["responses"]["401"] = _error("no or a wrong server token")
    return {"get": operation}


def document(*, token: bool) -> dict[str, Any]:
    """The gateway's whole document; ``token``: the ops routes take the server token."""
    _, defs = models_json_schema(
        [(m, "serialization") for m in (ErrorBody, ChatRequest, wire.ChatCompletion, Health)],
        ref_template=_REF,
    )
    text = {
        "description": "Prometheus text",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    stats = {
        "description": "the gateway's counts and each run's desk",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    models = {
        "description": "the upstream's model list, without a lease",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "slotrunner admission gateway",
            "version": "0.1.0",
            "description": "An OpenAI-compatible door: every chat completion holds a lease "
            "of its eval-run's admission desk (docs/architecture.md §Gateway).",
        },
        "paths": {
            "/v1" + wire.ROUTE: _chat_completions(),
            "/v1/models": {
                "get": {
                    "operationId": "models",
                    "security": [{"agentCredential": []}],
                    "responses": {
                        "200": models,
                        "502": _error("the upstream could not be reached"),
                        "4XX": {"description": "the upstream's own answer, passed on"},
                        **_credential_errors(),
                    },
                }
            },
            "/healthz": _ops("Whether the gateway is up", _json("Health", "up"), token=token),
            "/metrics": _ops("Prometheus text (runner/gateway/metrics.py)", text, token=token),
            "/stats": _ops("The same counts as JSON", stats, token=token),
        },
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "agentCredential": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a credential minted for one job attempt (mint_credential)",
                },
                "serverToken": {"type": "apiKey", "in": "header", "name": TOKEN_HEADER},
                "serverBearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }
