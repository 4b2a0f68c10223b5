"""The gateway benchmark's floor server: a proxy hop that does nothing else.

``POST /v1/chat/completions`` forwards the raw body to the upstream with a kept-alive
``httpx.AsyncClient`` (as the gateway does) and passes the answer's status and body
back; no credential, no desk, no parsing. Started like the tool server and the no-op
servers (``bench.noop_server.serve``: uvicorn on 127.0.0.1, warning log level, no
access log), so what separates it from a straight call is the extra hop on this stack,
the least any gateway in front of the endpoint costs here.

    python -m bench.noop_proxy --port 8125 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.noop_server import serve


def create_app(upstream: str) -> Starlette:
    clients: list[httpx.AsyncClient] = []

    async def forward(request: Request) -> Response:
        reply = await clients[0].post(
            "/v1/chat/completions",
            content=await request.body(),
            headers={"content-type": "application/json"},
        )
        return Response(reply.content, reply.status_code, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=upstream, timeout=30) as client:
            clients.append(client)
            yield

    return Starlette(
        routes=[
            Route("/v1/chat/completions", forward, methods=["POST"]),
            Route("/healthz", healthz),
        ],
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--upstream", required=True, help="base URL of the endpoint")

    serve(lambda args: create_app(args.upstream), "python -m bench.noop_proxy", argv, options)


if __name__ == "__main__":
    main()
