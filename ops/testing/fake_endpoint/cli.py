"""``slotrunner fake-endpoint``: run the fault-injecting OpenAI-compatible endpoint.

``slotrunner`` mounts :data:`fake_endpoint` through its ``slotrunner.commands`` entry
point; ``python -m ops.testing.fake_endpoint.cli`` runs it through ``slotrunner``.
Bad flags or a bad ``--script`` are click usage errors (exit 2); a port that cannot
be bound is one ``error:`` line (runner.cli.errors, exit 2).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from ops.testing.fake_endpoint.plan import FakeEndpointConfig
from ops.testing.fake_endpoint.server import make_server
from runner.cli.errors import CliError

F = TypeVar("F", bound=Callable[..., Any])


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _validation_message(exc: ValidationError) -> str:
    """Pydantic's complaint, in the words of the command line (flags, script steps)."""
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        for name in FakeEndpointConfig.model_fields:
            message = message.replace(name, _flag(name))
        if loc[:1] == ["script"] and len(loc) > 1:
            where = f"--script step {loc[1]}" + "".join(f" {p}" for p in loc[2:])
        else:
            where = _flag(loc[0]) if loc else "options"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def load_script(path: str) -> list[dict[str, Any]]:
    """The JSON list of steps in ``path``, or a usage error naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise click.UsageError(f"cannot read --script {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise click.UsageError(f"--script {path} is not JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise click.UsageError(
            f"--script {path} must be a non-empty JSON list of steps: "
            '[{"tool": NAME, "args": {...}}, ..., {"final": TEXT}]'
        )
    return data


def _float(name: str, default: float, text: str) -> Callable[[F], F]:
    return click.option(name, type=float, default=default, show_default=True, help=text)


@click.command(name="fake-endpoint", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8790,
    show_default=True,
    help="Port to bind (0: any free port, printed at start).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seeds every fault: the n-th arrival of the same request body gets the "
    "same fate on every run with this seed.",
)
@click.option("--model", default="fake-model", show_default=True, help="Name in /v1/models.")
@click.option(
    "--api-key",
    default=None,
    help="Require this key (Authorization: Bearer KEY) on chat completions, as a "
    "provider does; others get 401. Default: no key.",
)
@click.option(
    "--script",
    "script_path",
    type=click.Path(dir_okay=False),
    help='Script mode: a JSON list of steps, [{"tool": NAME, "args": {...}}, ..., '
    '{"final": TEXT}]. The step answered is the number of role "tool" '
    "messages in the request, so a retry gets the same step. "
    "Without it: echo mode.",
)
@click.option(
    "--echo-text", default="ok", show_default=True, help="Echo mode: the fixed answer text."
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Concurrency limit: a request arriving while this many are in service is "
    "answered 429 with Retry-After. 0: no limit.",
)
@click.option(
    "--retry-after-s",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Seconds sent in the Retry-After header of a 429.",
)
@_float("--service-ms-median", 50.0, "Service time: median of the lognormal, in ms.")
@_float("--service-ms-p99", 150.0, "Service time: p99 of the lognormal, in ms (the tail).")
@_float("--slow-prob", 0.0, "Slow tail: probability a request takes --slow-ms instead.")
@_float("--slow-ms", 1000.0, "Slow tail: service time of a slow request, in ms.")
@_float(
    "--hang-prob",
    0.0,
    "Timeout fault: probability a request hangs --hang-s, then is "
    "answered anyway (a late body the client has given up on).",
)
@_float("--hang-s", 30.0, "Timeout fault: how long a hung request sleeps, in seconds.")
@_float("--error-prob", 0.0, "5xx fault: probability of a 500, 502 or 503.")
@_float("--empty-prob", 0.0, "Protocol fault: probability of a 200 with an empty body.")
@_float(
    "--invalid-prob",
    0.0,
    "Protocol fault: probability of a 200 whose body is not a "
    "chat completion (truncated JSON, no choices, wrong types).",
)
@_float(
    "--duplicate-prob",
    0.0,
    "Duplicate fault: probability a retry of a request is "
    "served the completion an earlier attempt got (same id).",
)
def fake_endpoint(host: str, port: int, script_path: str | None, **knobs: Any) -> None:
    """Serve a fault-injecting OpenAI-compatible chat-completions endpoint.

    Routes: POST /v1/chat/completions ("stream": true answers server-sent
    chat.completion.chunk events), GET /v1/models, GET /healthz, GET /stats.
    Every response carries x-service-time-ms (the endpoint's own clock) and
    x-fake-fault (what was injected). Faults are drawn per request from --seed.
    """
    if script_path is not None:
        knobs["script"] = load_script(script_path)
    try:
        config = FakeEndpointConfig(**knobs)
    except ValidationError as exc:
        raise click.UsageError(_validation_message(exc)) from None
    try:
        server = make_server(config, host, port)
    except OSError as exc:
        raise CliError(f"cannot bind {host}:{port}") from exc
    mode = f"script of {len(config.script)} steps" if config.script else "echo"
    click.echo(f"fake endpoint on http://{host}:{server.port}/v1 ({mode}, seed {config.seed})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    from runner.cli.main import run_verb

    run_verb("fake-endpoint", sys.argv[1:])
