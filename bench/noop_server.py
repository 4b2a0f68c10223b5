"""The pipeline benchmark's baseline server: FastAPI under uvicorn, doing nothing.

Started as a child process exactly like the tool server (``uvicorn.run``, 127.0.0.1,
the same ``runner.core.serving.UVICORN_OPTIONS``: uvloop, httptools,
warning log level, no access log), so the difference between the two is the tool
pipeline, not the web stack. ``POST /v1/tools/{tool}`` reads the body and answers a
fixed JSON object; ``GET /healthz`` answers ``{"ok": true}``.

    python -m bench.noop_server --port 8123
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp

from runner.core.serving import UVICORN_OPTIONS


def create_app() -> FastAPI:
    app = FastAPI(title="slotrunner bench no-op server")

    @app.post("/v1/tools/{tool}")
    async def noop(tool: str, request: Request) -> Response:
        await request.body()  # receiving the body is part of any call's cost
        return JSONResponse({"result": {}, "receipt": None, "replayed": False})

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"ok": True})

    return app


def serve(
    make_app: Callable[[argparse.Namespace], ASGIApp],
    prog: str,
    argv: list[str] | None,
    add_options: Callable[[argparse.ArgumentParser], None] = lambda _: None,
) -> None:
    """Run the app as the tool server runs: 127.0.0.1, warning log level, no access log."""
    import uvicorn

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    add_options(parser)
    args = parser.parse_args(argv)
    uvicorn.run(make_app(args), host="127.0.0.1", port=args.port, **UVICORN_OPTIONS)


def main(argv: list[str] | None = None) -> None:
    serve(lambda _: create_app(), "python -m bench.noop_server", argv)


if __name__ == "__main__":
    main()
