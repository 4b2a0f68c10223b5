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

import hmac
import ipaddress
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runner.core import events
from runner.core.durable import Fsync, os_fsync
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import read_stamp
from tools import registry, tokens
from tools.errors import ToolError
from tools.reasons import Reason
from tools.sandbox import run as sandbox
from tools.server.dispatch import Dispatcher
from tools.server.mcp import McpDoor
from tools.server.metrics import ToolMetrics
from tools.server.reply import Reply, refused
from tools.server.seams import CallHooks, Fence, envelope_fence
from tools.server.service import ToolService

MAX_BODY_BYTES = registry.MAX_FILE_BYTES + 64 * 1024
DEFAULT_MAX_CONCURRENT = 16
RETRY_AFTER_S = 1
TOKEN_HEADER = "x-slotrunner-token"


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


def _json_body(status: int, reason: Reason, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": reason.value, "message": message}).encode()


class _Guard:
    """Token and body-size checks before any route runs: a pure ASGI middleware.

    Not ``@app.middleware("http")``: Starlette runs those through
    ``BaseHTTPMiddleware``, which wraps every request and response in an extra task
    group and a streamed response, on every call (measured in ``bench/`` pipeline).
    This one reads the headers in the scope and either answers at once or passes the
    call through untouched.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The MCP door is authenticated by the caller's lease token alone
        # (tools.server.mcp.BearerAuth), which its Authorization header carries.
        refusal = self._refusal(scope["headers"], check_token=scope["path"] != tokens.MCP_PATH)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body = refusal
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _refusal(
        self, raw_headers: list[tuple[bytes, bytes]], *, check_token: bool
    ) -> tuple[int, bytes] | None:
        headers: dict[bytes, bytes] = {}
        for name, value in raw_headers:
            headers.setdefault(name.lower(), value)  # the first of repeated headers, as Starlette
        if self.token is not None and check_token:
            given = headers.get(TOKEN_HEADER.encode()) or headers.get(
                b"authorization", b""
            ).removeprefix(b"Bearer ")
            if not hmac.compare_digest(given, self.token):
                return _json_body(
                    401, Reason.UNAUTHORIZED, f"missing or wrong {TOKEN_HEADER} header"
                )
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _json_body(
                413, Reason.TOO_LARGE, f"body of {length} bytes exceeds {MAX_BODY_BYTES}"
            )
        return None


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
    app.state.sandbox = sandbox.self_test() if settings.sandbox != "off" else None
    app.state.recovered = service.recover()
    for item in app.state.recovered:
        event_log.emit(events.RECEIPT_RESOLVED, **item)

    app.add_middleware(_Guard, token=settings.token)

    # The MCP door at exactly /mcp (a Route, not a mount: /mcp/ redirects to it).
    app.router.routes.append(Route(tokens.MCP_PATH, endpoint=mcp.endpoint))

    def respond(reply: Reply) -> Response:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if reply.http_status == 429 else None
        return JSONResponse(reply.body, reply.http_status, headers=headers)

    @app.post("/v1/tools/{tool}")
    async def call_tool(tool: str, request: Request) -> Response:
        started = time.monotonic()
        decision = request.headers.get("x-slotrunner-retry")
        if decision:
            metrics.retries.labels(decision[:40]).inc()
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            too_large = refused(413, Reason.TOO_LARGE, f"body exceeds {MAX_BODY_BYTES} bytes")
            return respond(dispatcher.finish(tool, too_large, started))
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            malformed = refused(422, Reason.MALFORMED, f"the body is not JSON: {exc}")
            return respond(dispatcher.finish(tool, malformed, started))
        return respond(await dispatcher.call(tool, payload, started))

    @app.get("/v1/receipts/{key}")
    async def get_receipt(key: str, slot: str) -> Response:
        reply = await run_in_threadpool(service.lookup, key, slot)
        return JSONResponse(reply.body, reply.http_status)

    @app.get("/v1/slots")
    async def list_slots() -> Response:
        stamps = []
        if settings.slots_dir.is_dir():
            for slot_dir in sorted(settings.slots_dir.iterdir()):
                stamp = read_stamp(slot_dir) if slot_dir.is_dir() else None
                if stamp is not None:
                    stamps.append(stamp.model_dump())
        return JSONResponse({"slots": stamps})

    @app.get("/healthz")
    async def healthz() -> Response:
        test = app.state.sandbox
        return JSONResponse(
            {
                "ok": True,
                "host": settings.host,
                "sandbox_mode": settings.sandbox,
                "sandbox": None if test is None else {"ok": test.ok, "detail": test.detail},
                "recovered_intents": len(app.state.recovered),
            }
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(
            generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4"
        )

    return app


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
) -> None:
    run_app(create_app(settings, bind_host=host, max_concurrent=max_concurrent), host, port)


def run_app(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` until stopped: no access log (the JSONL log has every call)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
