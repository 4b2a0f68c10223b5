"""The tool server's edges: auth off loopback, size limits, saturation, metrics, fuzz."""

from __future__ import annotations

import json
import string
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ops.testing.stack import Child, free_port, slotrunner_argv
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.stack import wait_until
from tests.support.toolserver import ToolServer, child_env
from tools import registry
from tools.server.app import ServerConfigError, create_app

# A run_tests that stays in flight until the test writes ``go`` (or ~30 s pass): the
# test, not a sleep, decides how long the server is saturated.
GATED_RUN_TESTS = (
    "touch started; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
)


def test_refuses_to_start_off_loopback_without_token(settings: Settings) -> None:
    """Binding a non-loopback address without SLOTRUNNER_TOKEN is refused."""
    with pytest.raises(ServerConfigError, match="SLOTRUNNER_TOKEN"):
        create_app(settings.with_(token=None), bind_host="0.0.0.0")


def test_cli_refuses_off_loopback_without_token(settings: Settings, tmp_path: Path) -> None:
    """`slotrunner toolserver --host 0.0.0.0` without a token exits 2 with a clear message."""
    child = Child(
        "ts",
        slotrunner_argv("toolserver", "--host", "0.0.0.0", "--port", str(free_port())),
        child_env(settings),
        tmp_path / "ts.out",
    )
    child.proc.wait(timeout=60)
    assert child.proc.returncode == 2
    assert "SLOTRUNNER_TOKEN" in child.tail()
    child.stop()


def test_token_required_on_every_request(settings: Settings, tmp_path: Path) -> None:
    """With a token configured, a request without it gets 401; with it, 200."""
    server = ToolServer(
        settings.with_(token="s3cret"), tmp_path / "logs", SLOTRUNNER_TOKEN="s3cret"
    )
    try:
        assert httpx.get(f"{server.url}/v1/slots").status_code == 401
        wrong = httpx.get(f"{server.url}/v1/slots", headers={"x-slotrunner-token": "nope"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "unauthorized"
        ok = httpx.get(f"{server.url}/v1/slots", headers={"x-slotrunner-token": "s3cret"})
        assert ok.status_code == 200
    finally:
        server.stop()


def test_token_is_checked_before_any_route_and_bearer_is_accepted(
    settings: Settings, tmp_path: Path
) -> None:
    """A tool call without the token is refused 401 as JSON; a Bearer token passes the guard."""
    server = ToolServer(
        settings.with_(token="s3cret"), tmp_path / "logs", SLOTRUNNER_TOKEN="s3cret"
    )
    try:
        refused = httpx.post(f"{server.url}/v1/tools/read_file", content=b"not even json")
        assert refused.status_code == 401
        assert refused.headers["content-type"] == "application/json"
        assert refused.json()["error"] == "unauthorized"
        bearer = {"authorization": "Bearer s3cret"}
        assert httpx.get(f"{server.url}/v1/slots", headers=bearer).status_code == 200
        # Past the guard, a bad body is the route's 422, not the guard's 401.
        past = httpx.post(
            f"{server.url}/v1/tools/read_file", content=b"not even json", headers=bearer
        )
        assert past.status_code == 422 and past.json()["error"] == "malformed"
    finally:
        server.stop()


def test_oversized_body_is_413(toolserver: ToolServer) -> None:
    """A body past the limit is refused 413 too_large before it is parsed."""
    big = b"x" * (registry.MAX_FILE_BYTES + 128 * 1024)
    response = httpx.post(
        f"{toolserver.url}/v1/tools/write_file",
        content=big,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413 and response.json()["error"] == "too_large"


def test_saturated_server_answers_429_with_retry_after(settings: Settings, tmp_path: Path) -> None:
    """With max-concurrent 1 and a run_tests in flight, the next call gets 429 + Retry-After."""
    from tools.builtin import write_job

    port = free_port()
    settings = settings.with_(toolserver_url=f"http://127.0.0.1:{port}")
    child = Child(
        "ts",
        slotrunner_argv("toolserver", "--port", str(port), "--max-concurrent", "1"),
        child_env(settings),
        tmp_path / "ts.out",
    )
    try:
        from ops.testing.stack import wait_http

        wait_http(child, f"{settings.toolserver_url}/healthz", 30)
        repo = tmp_path / "repo"
        base = make_repo(repo)
        pool = SlotPool(
            settings, redis.Redis.from_url(settings.redis_url or ""), EventLog(settings)
        )
        stamp = pool.lease("job-A", 1)
        slot_dir = settings.slots_dir / stamp.slot_id
        Workspaces(settings.home).prepare(slot_dir, str(repo), base, "job-A")
        marker, go = slot_dir / "work" / "started", slot_dir / "work" / "go"
        write_job(
            slot_dir,
            {
                "job_id": "job-A",
                "generation": stamp.generation,
                # In flight until the test says go (bounded at ~30 s): no race with a clock.
                "test_command": ["/bin/sh", "-c", GATED_RUN_TESTS],
                "test_timeout_s": 30,
            },
        )
        env = {
            "job_id": "job-A",
            "attempt": 1,
            "slot_id": stamp.slot_id,
            "generation": stamp.generation,
        }
        slow = threading.Thread(
            target=httpx.post,
            args=(f"{settings.toolserver_url}/v1/tools/run_tests",),
            kwargs={
                "json": {
                    "envelope": {**env, "tool": "run_tests", "idempotency_key": "t1"},
                    "args": {},
                },
                "timeout": 30,
            },
        )
        slow.start()
        try:
            wait_until("run_tests to start", marker.exists, timeout_s=30)
            busy = httpx.post(
                f"{settings.toolserver_url}/v1/tools/read_file",
                json={"envelope": {**env, "tool": "read_file"}, "args": {"path": "README"}},
            )
        finally:
            go.touch()
            slow.join(30)
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "1" and busy.json()["error"] == "saturated"
    finally:
        child.stop()


def test_metrics_expose_calls_refusals_retries_and_fsync_latency(
    toolserver: ToolServer, tmp_path: Path
) -> None:
    """/metrics: calls by outcome, refusals by reason, retries by decision, receipt latency."""
    repo = tmp_path / "repo"
    base = make_repo(repo)
    settings = toolserver.settings
    pool = SlotPool(settings, redis.Redis.from_url(settings.redis_url or ""), EventLog(settings))
    stamp = pool.lease("job-A", 1)
    Workspaces(settings.home).prepare(settings.slots_dir / stamp.slot_id, str(repo), base, "job-A")
    env = {
        "job_id": "job-A",
        "attempt": 1,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
    }
    url = f"{toolserver.url}/v1/tools/write_file"
    httpx.post(
        url,
        json={
            "envelope": {**env, "tool": "write_file", "idempotency_key": "m1"},
            "args": {"path": "a", "content": "x"},
        },
    )
    httpx.post(
        url,
        json={
            "envelope": {**env, "generation": 99, "tool": "write_file", "idempotency_key": "m2"},
            "args": {"path": "a", "content": "x"},
        },
    )
    httpx.post(
        url,
        json={
            "envelope": {**env, "tool": "write_file", "idempotency_key": "m1"},
            "args": {"path": "a", "content": "x"},
        },
        headers={"x-slotrunner-retry": "reconcile"},
    )
    text = httpx.get(f"{toolserver.url}/metrics").text
    assert 'slotrunner_tool_calls_total{outcome="applied",tool="write_file"} 1.0' in text
    assert 'slotrunner_tool_calls_total{outcome="replayed",tool="write_file"} 1.0' in text
    assert 'slotrunner_refusals_total{reason="stale_generation"} 1.0' in text
    assert 'slotrunner_client_retries_total{decision="reconcile"} 1.0' in text
    assert "slotrunner_receipt_write_seconds_count 2.0" in text
    assert "slotrunner_executions_in_flight 0.0" in text


# -- fuzz: no input makes the server answer 5xx -------------------------------------

_text = st.text(alphabet=string.printable + "\u00e9\u2215\uff0e\x00", max_size=40)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_envelope = st.fixed_dictionaries(
    {
        "job_id": st.sampled_from(["job-A", "job-B", ""]) | _text,
        "attempt": st.integers(-2, 3) | _json,
        "slot_id": st.sampled_from(["S0", "S1", "../S0", "S0/../../x"]) | _text,
        "generation": st.integers(-1, 3) | _json,
        "tool": st.sampled_from(sorted(registry.TOOLS)) | _text,
        "idempotency_key": st.none() | _text,
    },
)
_args = st.fixed_dictionaries(
    {},
    optional={
        "path": st.sampled_from(["a.txt", "../x", "/etc/passwd", ".git/config", ""]) | _text,
        "content": _text,
        "patch": _text,
        "src": _text,
        "dst": _text,
        "message": _text,
    },
)


@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tool=st.sampled_from([*sorted(registry.TOOLS), "nope", "..%2f"]),
    body=st.one_of(_json, st.fixed_dictionaries({"envelope": _envelope, "args": _args})),
)
def test_generated_requests_never_get_a_5xx(
    fuzz_server: tuple[str, dict[str, Any]], tool: str, body: Any
) -> None:
    """Whatever the body, envelope or arguments, the server answers with a 2xx-4xx, never 5xx."""
    url, live = fuzz_server
    if (
        isinstance(body, dict)
        and isinstance(body.get("envelope"), dict)
        and body["envelope"].get("job_id") == "job-A"
    ):
        body["envelope"].update(live)  # sometimes a valid lease, so effects are reached too
    response = httpx.post(f"{url}/v1/tools/{tool}", content=json.dumps(body).encode(), timeout=30)
    assert response.status_code < 500, response.text


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Any:
    import uuid

    tmp = tmp_path_factory.mktemp("fuzz")
    settings = Settings.from_env(
        {
            "SLOTRUNNER_HOME": str(tmp / "home"),
            "REDIS_URL": redis_url,
            "SLOTRUNNER_SLOTS": "2",
            "SLOTRUNNER_HOST_ID": f"fuzz-{uuid.uuid4().hex[:6]}",
            "SLOTRUNNER_SANDBOX": "off",
        }
    )
    server = ToolServer(settings, tmp / "logs")
    repo = tmp / "repo"
    base = make_repo(repo)
    pool = SlotPool(server.settings, redis.Redis.from_url(redis_url), EventLog(server.settings))
    stamp = pool.lease("job-A", 1)
    Workspaces(settings.home).prepare(settings.slots_dir / stamp.slot_id, str(repo), base, "job-A")
    try:
        yield server.url, {"slot_id": stamp.slot_id, "generation": stamp.generation, "attempt": 1}
    finally:
        server.stop()
