"""The per-host tool server: FastAPI over :class:`tools.server.service.ToolService`.

Endpoints (docs/architecture.md §Tool API): ``POST /v1/tools/{tool}``,
``GET /v1/receipts/{key}?slot=``, ``GET /v1/slots``, ``GET /healthz``,
``GET /metrics``, and the MCP door ``/mcp`` (``tools.server.mcp``, §MCP). Both doors
send a call through ``tools.server.dispatch``: one JSON log line per call, written
before the reply is sent. Binds 127.0.0.1 unless told otherwise; off loopback it
refuses to start without a token, and every request but ``/mcp`` (which takes a lease
token instead, §Lease tokens) must carry it.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.routing import Route

from runner.core import events
from runner.core.durable import Fsync, os_fsync
from runner.core.logs import EventLog
from runner.core.serving import UVICORN_OPTIONS
from runner.core.settings import Settings
from runner.core.stamp import read_stamp
from tools import registry, tokens
from tools.client import RETRY_HEADER
from tools.errors import ToolError
from tools.reasons import Reason
from tools.sandbox import run as sandbox
from tools.server import openapi, wire
from tools.server.body import decode
from tools.server.dispatch import Dispatcher
from tools.server.guard import Guard
from tools.server.lanes import Lanes
from tools.server.mcp import McpDoor
from tools.server.metrics import ToolMetrics
from tools.server.reply import Reply, refused
from tools.server.seams import CallHooks, Fence, envelope_fence
from tools.server.service import ToolService

DEFAULT_MAX_CONCURRENT = 16
RETRY_AFTER_S = 1


class _AnyText(PathConvertor):
    """A path parameter of any text, newlines too (Starlette's ``path`` stops at one):
    every name under /v1/tools/ is a tool's, every key under /v1/receipts/ a key."""

    regex = "(?s:.*)"


register_url_convertor("anytext", _AnyText())


class ServerConfigError(ToolError):
    """The server would start in an unsafe or impossible configuration."""

    # The one unsafe start refused today: off loopback without a token.
    reason = Reason.UNAUTHORIZED


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(
    settings: Settings,
    *,
    bind_host: str = "127.0.0.1",
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    log: EventLog | None = None,
    fence: Fence = envelope_fence,
    fsync: Fsync = os_fsync,
    hooks: CallHooks | None = None,
) -> FastAPI:
    """The server's app. ``fence``, ``fsync`` and ``hooks`` are the service's seams
    (``tools.server.seams``); only a test process passes other ones."""
    if not is_loopback(bind_host) and not settings.token:
        raise ServerConfigError(
            f"refusing to listen on {bind_host} without a token: set SLOTRUNNER_TOKEN"
        )
    metrics = ToolMetrics()
    event_log = log or EventLog(settings)

    def emit_resolved(**fields: Any) -> None:
        event_log.emit(events.TOOL_RESULT, **fields)

    service = ToolService(
        settings,
        on_receipt_write=metrics.receipt_write_s.observe,
        emit=emit_resolved,
        fence=fence,
        fsync=fsync,
        hooks=hooks,
    )
    dispatcher = Dispatcher(service, metrics, event_log, max_concurrent)
    mcp = McpDoor(settings, dispatcher)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.running():
            yield

    app = FastAPI(title="slotrunner tool server", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    if settings.sandbox != "off":
        sandbox.self_test()  # at start, so the first call does not wait for the probe
    app.state.recovered = service.recover()
    for item in app.state.recovered:
        event_log.emit(events.RECEIPT_RESOLVED, **item)

    # A parameter FastAPI itself validates (the receipt lookup's ``slot``) is refused as
    # every other malformed request is: {error, message}, not FastAPI's own 422 body.
    app.add_exception_handler(RequestValidationError, _malformed_parameters)
    token = settings.token is not None

    def published() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi.document(app, token=token)
        return app.openapi_schema

    # FastAPI's documented way to publish a document of one's own: replace the method.
    app.openapi = published  # type: ignore[method-assign]

    # The MCP door at exactly /mcp (a Route, not a mount: /mcp/ redirects to it).
    app.router.routes.append(Route(tokens.MCP_PATH, endpoint=mcp.endpoint))

    def respond(reply: Reply) -> Response:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if reply.http_status == 429 else None
        return JSONResponse(reply.body, reply.http_status, headers=headers)

    async def call_tool(tool: str, body: bytes, decision: str | None) -> Response:
        started = time.monotonic()
        if decision:
            metrics.retries.labels(decision[:40]).inc()
        payload, problem = decode(body)  # the guard bounds its size
        if problem is not None:
            malformed = refused(422, Reason.MALFORMED, problem)
            return respond(dispatcher.finish(tool, malformed, started))
        return respond(await dispatcher.call(tool, payload, started))

    def tool_endpoint(tool: str) -> Callable[[Request], Awaitable[Response]]:
        # The lane below answers these paths first; the route is what the OpenAPI
        # document describes, and answers the same way should a request reach it.
        async def endpoint(request: Request) -> Response:
            headers = request.headers
            return await call_tool(tool, await request.body(), headers.get(RETRY_HEADER))

        return endpoint

    # One operation per tool, so the schema gives each its own body and result; any
    # other name under /v1/tools/ is the unknown tool it is (404), whatever its body.
    for spec in registry.TOOLS.values():
        app.add_api_route(
            f"/v1/tools/{spec.name}",
            tool_endpoint(spec.name),
            methods=["POST"],
            operation_id=spec.name,
            summary=registry.describe(spec.name),
            tags=["mutating tools" if spec.mutating else "read-only tools"],
            response_model=None,
            responses=openapi.tool_responses(spec, token=token),
            openapi_extra=openapi.tool_request_body(spec),
        )

    # Every call's two doors skip FastAPI's routing (tools.server.lanes); the guard,
    # added last, is outermost: the token and the body limit hold for them too.
    app.add_middleware(
        Lanes,
        tools=list(registry.TOOLS),
        call=call_tool,
        mcp_path=tokens.MCP_PATH,
        mcp=mcp.endpoint,
    )
    app.add_middleware(Guard, token=settings.token)

    @app.post(
        "/v1/tools/{tool:anytext}",
        operation_id="any_tool",
        summary="Any name: a tool's reaches its operation above; any other is unknown_tool",
        description="The body is the named tool's call (see its operation).",
        response_model=None,
        responses=openapi.any_tool_responses(token=token),
    )
    async def unknown_tool(tool: str) -> Response:
        return respond(dispatcher.finish(tool, service.unknown_tool(tool), time.monotonic()))

    @app.get(
        "/v1/receipts/{key:anytext}",
        operation_id="get_receipt",
        summary="The outcome of an idempotency key on one slot",
        response_model=None,
        responses=openapi.receipt_responses(token=token),
    )
    async def get_receipt(key: str, slot: str) -> Response:
        reply = await run_in_threadpool(service.lookup, key, slot)
        return JSONResponse(reply.body, reply.http_status)

    @app.get(
        "/v1/slots",
        operation_id="list_slots",
        summary="The stamp of every slot of this host",
        response_model=wire.Slots,
        responses=openapi.guard_responses(token=token),
    )
    async def list_slots() -> Response:
        stamps = []
        if settings.slots_dir.is_dir():
            for slot_dir in sorted(settings.slots_dir.iterdir()):
                stamp = read_stamp(slot_dir) if slot_dir.is_dir() else None
                if stamp is not None:
                    stamps.append(stamp)
        return JSONResponse(wire.Slots(slots=stamps).model_dump(mode="json"))

    @app.get(
        "/healthz",
        operation_id="healthz",
        summary="Whether the server is up, and its sandbox",
        response_model=wire.Health,
        responses=openapi.guard_responses(token=token),
    )
    async def healthz() -> Response:
        # The self-test as it stands now: a failed one is probed again after a while.
        test = None if settings.sandbox == "off" else await run_in_threadpool(sandbox.self_test)
        health = wire.Health(
            ok=True,
            host=settings.host,
            sandbox_mode=settings.sandbox,
            sandbox=None if test is None else wire.SandboxCheck(ok=test.ok, detail=test.detail),
            recovered_intents=len(app.state.recovered),
        )
        return JSONResponse(health.model_dump(mode="json"))

    @app.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus text (tools/server/metrics.py)",
        response_class=PlainTextResponse,
        responses=openapi.guard_responses(token=token),
    )
    async def prometheus() -> Response:
        return PlainTextResponse(
            generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4"
        )

    return app


async def _malformed_parameters(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    body = {"error": Reason.MALFORMED.value, "message": "; ".join(parts)}
    return JSONResponse(body, 422)


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
) -> None:
    run_app(create_app(settings, bind_host=host, max_concurrent=max_concurrent), host, port)


def run_app(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` until stopped, as every server is (``runner.core.serving``)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, **UVICORN_OPTIONS)
