"""The admission gateway's HTTP app: an OpenAI-compatible door in front of each run's upstream.

Routes (docs/architecture.md §Gateway):

- ``POST /v1/chat/completions``: the agent's credential (``Authorization: Bearer``,
  ``runner/gateway/credentials.py``) names its run; the request is forwarded to that
  run's upstream under a lease of its desk (``runner/gateway/forward.py``). No
  credential, or an unknown one: 401 and nothing is forwarded; a credential of a
  superseded attempt: 403.
- ``GET /v1/models``: the upstream's list, under the same credential, without a
  lease (it is not inference).
- ``GET /healthz``, ``GET /metrics`` (Prometheus text), ``GET /stats`` (the same
  counts as JSON, and the desk of every run served), ``GET /openapi.json`` (the
  routes above as OpenAPI, ``runner/gateway/schema.py``).

Binds 127.0.0.1 unless told otherwise. Off loopback it fails closed as the tool
server does (``tools/server/app.py``): it refuses to start without
``SLOTRUNNER_TOKEN``, and then ``/healthz``, ``/metrics``, ``/stats`` and
``/openapi.json`` require that token (``x-slotrunner-token`` or ``Authorization:
Bearer``). The ``/v1`` routes take only the agents' own credentials: the host's token
is never handed to an agent.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import redis
import redis.asyncio
from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from runner.admission.desk import DEFAULT_MAX_WAITING
from runner.agent import openai_wire as wire
from runner.core.settings import Settings
from runner.errors import RunnerError
from runner.gateway import schema
from runner.gateway.credentials import Caller
from runner.gateway.forward import CONNECT_TIMEOUT_S, Forwarder
from runner.gateway.metrics import GatewayMetrics
from runner.gateway.replies import error, passed_headers
from runner.redis_server import connect
from tools.server.app import is_loopback
from tools.server.guard import TOKEN_HEADER

MAX_BODY_BYTES = 16 * 1024 * 1024  # a long conversation with its tools
DRAIN_S = 30.0  # at shutdown, how long late answers still out are waited for
KEEPALIVE_CONNECTIONS = 128


class GatewayConfigError(RunnerError):
    """The gateway would start in an unsafe configuration (off loopback without a token)."""


# What a connection of the blocking client is made with that an asyncio one takes too.
_TWIN_KWARGS = frozenset(
    {
        *("host", "port", "path", "db", "username", "password", "client_name"),
        *("decode_responses", "encoding", "encoding_errors", "health_check_interval"),
        *("socket_timeout", "socket_connect_timeout", "socket_keepalive"),
        *("ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname"),
    }
)


def async_twin(client: redis.Redis) -> redis.asyncio.Redis:
    """An asyncio client of the server ``client`` talks to, made as ``client`` was."""
    pool = client.connection_pool
    kind: type[redis.asyncio.Connection] = {
        "UnixDomainSocketConnection": redis.asyncio.UnixDomainSocketConnection,
        "SSLConnection": redis.asyncio.SSLConnection,
    }.get(pool.connection_class.__name__, redis.asyncio.Connection)
    given = {k: v for k, v in pool.connection_kwargs.items() if k in _TWIN_KWARGS}
    return redis.asyncio.Redis(
        connection_pool=redis.asyncio.ConnectionPool(connection_class=kind, **given)
    )


def _bearer(request: Request) -> str:
    return request.headers.get("authorization", "").removeprefix("Bearer ").strip()


def create_app(
    settings: Settings,
    *,
    bind_host: str = "127.0.0.1",
    redis_client: redis.Redis | None = None,
    api_keys: Mapping[str, str] | None = None,
    retry_after_s: int = 1,
    max_waiting: int = DEFAULT_MAX_WAITING,
) -> Starlette:
    """The gateway's app. ``api_keys`` is where the upstreams' keys named by grants are
    looked up (the CLI passes the gateway's environment); no keys by default."""
    if not is_loopback(bind_host) and not settings.token:
        raise GatewayConfigError(
            f"refusing to listen on {bind_host} without a token: set SLOTRUNNER_TOKEN"
        )
    if retry_after_s < 1:
        raise ValueError(f"retry_after_s must be at least 1, got {retry_after_s!r}")
    client = redis_client if redis_client is not None else connect(settings)
    metrics = GatewayMetrics()
    token = settings.token.encode() if settings.token else None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS)
        aio = async_twin(client)  # made here: an asyncio client belongs to its loop
        async with (
            aio,
            httpx.AsyncClient(
                limits=limits,
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                transport=httpx.AsyncHTTPTransport(retries=0, limits=limits),
            ) as http,
        ):
            forwarder = Forwarder(
                client,
                aio,
                http,
                metrics,
                home=settings.home,
                api_keys=api_keys or {},
                retry_after_s=retry_after_s,
                max_waiting=max_waiting,
            )
            app.state.forwarder = forwarder
            try:
                yield
            finally:
                await forwarder.drain(DRAIN_S)

    def ops_refusal(request: Request) -> Response | None:
        if token is None:
            return None
        given = (request.headers.get(TOKEN_HEADER) or _bearer(request)).encode()
        if hmac.compare_digest(given, token):
            return None
        message = f"missing or wrong {TOKEN_HEADER} header"
        return JSONResponse({"error": "unauthorized", "message": message}, 401)

    async def caller_of(request: Request) -> Caller | Response:
        """The request's caller, or the refusal to answer it with."""
        secret = _bearer(request)
        forwarder: Forwarder = request.app.state.forwarder
        try:
            caller = await forwarder.authenticate(secret) if secret else None
        except redis.RedisError:
            metrics.outcome("desk_error")
            retry = {"retry-after": str(retry_after_s)}
            return error(503, "credentials cannot be checked now", "server_error", "desk", retry)
        if caller is None:
            metrics.outcome("unauthorized")
            message = "a slotrunner gateway credential is required (Authorization: Bearer ...)"
            headers = {"www-authenticate": "Bearer"}
            return error(401, message, "invalid_request_error", "invalid_api_key", headers)
        if caller.superseded_by is not None:
            metrics.outcome("superseded")
            message = (
                f"job {caller.grant.job_id} attempt {caller.grant.attempt} was superseded "
                f"by attempt {caller.superseded_by}"
            )
            return error(403, message, "invalid_request_error", "superseded")
        return caller

    async def chat_completions(request: Request) -> Response:
        caller = await caller_of(request)
        if isinstance(caller, Response):
            return caller
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            metrics.outcome("bad_request")
            message = f"body of {length} bytes exceeds {MAX_BODY_BYTES}"
            return error(413, message, "invalid_request_error", "too_large")
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            metrics.outcome("bad_request")
            return error(400, f"the body is not JSON: {exc}", "invalid_request_error", "json")
        if not isinstance(body, dict) or len(raw) > MAX_BODY_BYTES:
            metrics.outcome("bad_request")
            message = f"the body must be a JSON object of at most {MAX_BODY_BYTES} bytes"
            return error(400, message, "invalid_request_error", "body")
        forwarder: Forwarder = request.app.state.forwarder
        return await forwarder.chat(caller, raw, body.get("stream") is True)

    async def models(request: Request) -> Response:
        caller = await caller_of(request)
        if isinstance(caller, Response):
            return caller
        forwarder: Forwarder = request.app.state.forwarder
        headers = forwarder.upstream_headers(caller.grant, stream=False)
        if headers is None:
            message = f"the gateway has no upstream key in ${caller.grant.api_key_env}"
            return error(500, message, "server_error", "upstream_key_missing")
        try:
            answer = await forwarder.http.get(
                caller.grant.upstream + "/models", headers=headers, timeout=CONNECT_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            message = f"the upstream could not be reached: {type(exc).__name__}"
            return error(502, message, "upstream_error", "upstream_unreachable")
        return Response(answer.content, answer.status_code, headers=passed_headers(answer.headers))

    async def healthz(request: Request) -> Response:
        return ops_refusal(request) or JSONResponse({"ok": True, "host": settings.host})

    async def prometheus(request: Request) -> Response:
        return ops_refusal(request) or PlainTextResponse(
            generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4"
        )

    published = schema.document(token=token is not None)

    async def openapi_json(request: Request) -> Response:
        return ops_refusal(request) or JSONResponse(published)

    async def stats(request: Request) -> Response:
        refusal = ops_refusal(request)
        if refusal is not None:
            return refusal
        forwarder: Forwarder = request.app.state.forwarder
        desks = {run: await forwarder.quick(desk.stats) for run, desk in forwarder.desks().items()}
        return JSONResponse({"gateway": metrics.snapshot(), "desks": desks})

    app = Starlette(
        routes=[
            Route("/v1" + wire.ROUTE, chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
            Route("/openapi.json", openapi_json, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.metrics = metrics
    return app
