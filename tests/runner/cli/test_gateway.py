"""``slotrunner gateway`` (runner/cli/gateway.py): its help, its one-line errors, and the
real process serving with the settings' defaults."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import redis
from click.testing import CliRunner, Result

from ops.testing.stack import Child, free_port, slotrunner_argv, wait_http
from runner.cli.main import main
from runner.core.settings import Settings
from tests.support.gateway import client, new_run, upstream
from tests.support.ports import refusing_port
from tests.support.toolserver import child_env


def run(settings: Settings, *args: str, **env: str) -> Result:
    return CliRunner().invoke(
        main,
        ["gateway", *args],
        env={**settings.to_env(), **env},
        catch_exceptions=False,
        prog_name="slotrunner",
    )


def error_line(result: Result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_help_says_what_it_serves_and_how_it_refuses(settings: Settings) -> None:
    shown = run(settings, "--help")
    assert shown.exit_code == 0
    for text in ("--host", "--port", "--retry-after-s", "--max-waiting", "429", "Retry-After"):
        assert text in shown.stdout, text
    assert "SLOTRUNNER_TOKEN" in shown.stdout and "credential" in shown.stdout


def test_off_loopback_without_a_token_it_fails_closed_in_one_line(settings: Settings) -> None:
    line = error_line(run(settings, "--host", "0.0.0.0", "--port", "0", SLOTRUNNER_TOKEN=""))
    assert line == "error: refusing to listen on 0.0.0.0 without a token: set SLOTRUNNER_TOKEN"


def test_a_port_in_use_is_one_line(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = error_line(run(settings, "--port", str(port)))
    assert line.startswith(f"error: cannot bind 127.0.0.1:{port}: ")


def test_an_unreachable_redis_is_one_line(settings: Settings) -> None:
    with refusing_port() as port:
        line = error_line(run(settings, "--port", "0", REDIS_URL=f"redis://127.0.0.1:{port}/0"))
    assert line.startswith("error: Redis: ")


def test_the_process_serves_on_the_port_of_slotrunner_gateway_url(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """No --port: the gateway listens where SLOTRUNNER_GATEWAY_URL says agents find it."""
    from ops.testing.fake_endpoint.plan import FakeEndpointConfig
    from ops.testing.fake_endpoint.server import serve
    from runner.gateway import mint_credential

    port = free_port()
    settings = settings.with_(gateway_url=f"http://127.0.0.1:{port}/v1")
    child = Child(
        "gateway", slotrunner_argv("gateway"), child_env(settings), tmp_path / "gateway.out"
    )
    endpoint, endpoint_port = serve(FakeEndpointConfig(service_ms_median=2, service_ms_p99=4))
    try:
        wait_http(child, f"http://127.0.0.1:{port}/healthz", 30)
        credential = mint_credential(
            redis_client,
            gateway_url=settings.gateway_url,
            ttl_s=60,
            eval_run=new_run(),
            job_id="job-cli",
            attempt=1,
            upstream=upstream(endpoint_port),
            bound=1,
        )
        answer = client(credential).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "ok"
        assert (
            "slotrunner_gateway_requests_total"
            in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        )
    finally:
        child.stop()
        endpoint.close()
    assert f"gateway on http://127.0.0.1:{port}/v1" in child.log_path.read_text()
