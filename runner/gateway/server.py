"""Running the gateway's app: on a socket bound first, in the foreground or in a thread.

The socket is bound before uvicorn starts, so a port that cannot be bound is an
``OSError`` the CLI reports on one line (uvicorn itself would log and exit), and
port 0 gives a free port that is known before the first request.
:class:`GatewayThread` serves the app from a thread of the calling process (tests,
benchmarks, the demo), stopped by :meth:`GatewayThread.stop`.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp

from runner.core.serving import UVICORN_OPTIONS
from runner.errors import RunnerError

BACKLOG = 2048


class GatewayStartError(RunnerError):
    """The gateway's server did not come up (its thread ended or never got ready)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: any free one); OSError if not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # The protocol named, not 0: asyncio turns Nagle off only on sockets whose proto is
    # IPPROTO_TCP, and with it on every reply waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _server(app: ASGIApp) -> uvicorn.Server:
    # No access log (UVICORN_OPTIONS): the counts are on /metrics, and a busy gateway
    # would flood stderr.
    config = uvicorn.Config(app, lifespan="on", **UVICORN_OPTIONS)
    return uvicorn.Server(config)


def serve(app: ASGIApp, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM."""
    _server(app).run(sockets=[sock])


class GatewayThread:
    """The app served from a daemon thread on ``host`` and a free (or given) port."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.socket = bind(host, port)
        self.host = host
        self.port = int(self.socket.getsockname()[1])
        self._server = _server(app)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self.socket]},
            name=f"gateway-{self.port}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        """The API base agents are given: ``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> GatewayThread:
        self._thread.start()
        end = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop()
                raise GatewayStartError(f"the gateway on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.socket.close()

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
