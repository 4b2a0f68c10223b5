"""``slotrunner gateway``: serve the OpenAI-compatible admission gateway (runner/gateway/)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import click

from runner.cli.errors import CliError
from runner.core.settings import Settings

DEFAULT_PORT = 8791


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Off loopback SLOTRUNNER_TOKEN is required, and guards "
    "/healthz, /metrics and /stats; agents always use their own credentials.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help=f"Port (default: from SLOTRUNNER_GATEWAY_URL, else {DEFAULT_PORT}; 0: any free "
    "port, printed at start).",
)
@click.option(
    "--retry-after-s",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Seconds in the Retry-After of a 429 for a request the desk did not admit.",
)
@click.option(
    "--max-waiting",
    type=click.IntRange(min=0),
    default=64,
    show_default=True,
    help="Requests of one eval-run that may wait for capacity at its desk; beyond, 429.",
)
def gateway(host: str, port: int | None, retry_after_s: int, max_waiting: int) -> None:
    """Serve POST /v1/chat/completions to agents, under each eval-run's admission bound.

    An agent authenticates with the per-job credential its job runner minted
    (Authorization: Bearer ...), which names its eval-run, its upstream endpoint and
    the run's bound. Every request holds a lease of the run's admission desk while it
    is at the upstream: one the desk cannot admit within its wait is answered 429 with
    Retry-After; one past its local timeout is answered 504 and its late answer is
    dropped (counted stale); an upstream 429 is passed on and gives the capacity back;
    an upstream 5xx or connection failure is a 502. Streams ("stream": true) are passed
    through as they come. Upstream API keys named by a credential are read from this
    process's environment. Counts: GET /metrics (Prometheus), GET /stats (JSON).
    """
    from runner.gateway.app import create_app
    from runner.gateway.server import bind, serve
    from runner.redis_server import connect

    settings = Settings.from_env()
    if port is None:
        port = urlparse(settings.gateway_url).port or DEFAULT_PORT
    client = connect(settings)
    client.ping()  # a Redis that cannot be reached is one line now, not a 503 per request
    app = create_app(
        settings,
        bind_host=host,
        redis_client=client,
        api_keys=os.environ,
        retry_after_s=retry_after_s,
        max_waiting=max_waiting,
    )
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise CliError(f"cannot bind {host}:{port}") from exc
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"gateway on http://{shown}:{sock.getsockname()[1]}/v1")
    serve(app, sock)
