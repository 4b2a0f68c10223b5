"""The fake OpenAI endpoint: its shape, its script, and every fault it injects, over real HTTP."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict, ValidationError

from ops.testing.fake_endpoint.cli import fake_endpoint
from ops.testing.fake_endpoint.plan import FakeEndpointConfig, Fault, plan_request, request_digest
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve

# --- a mirror of the OpenAI chat.completion schema; extra keys are refused ----------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Strict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(_Strict):
    index: int
    message: Message
    logprobs: None
    finish_reason: Literal["stop", "tool_calls", "length", "content_filter"]


class Usage(_Strict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Strict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ErrorDetail(_Strict):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Strict):
    error: ErrorDetail


# --- helpers ------------------------------------------------------------------------------

SCRIPT: list[dict[str, Any]] = [
    {"tool": "write_file", "args": {"path": "a.txt", "content": "hi"}},
    {"tool": "read_file", "args": {"path": "a.txt"}},
    {"final": "done"},
]
FAST = {"service_ms_median": 1.0, "service_ms_p99": 3.0}


@pytest.fixture
def start() -> Iterator[Callable[..., tuple[FakeEndpointServer, str]]]:
    servers: list[FakeEndpointServer] = []

    def _start(**knobs: Any) -> tuple[FakeEndpointServer, str]:
        server, port = serve(FakeEndpointConfig(**knobs))
        servers.append(server)
        return server, f"http://127.0.0.1:{port}"

    yield _start
    for server in servers:
        server.close()


def chat_request(content: str = "hello", messages: list[dict[str, Any]] | None = None) -> Any:
    return {
        "model": "fake-model",
        "messages": messages or [{"role": "user", "content": content}],
        "tools": [{"type": "function", "function": {"name": "write_file", "parameters": {}}}],
        "tool_choice": "auto",
        "temperature": 0,
    }


def reached(server: FakeEndpointServer, predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until the endpoint's own state satisfies ``predicate`` (woken on each change)."""
    server.endpoint.wait_for(predicate, timeout_s=10)


def stats(base: str) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"{base}/stats").json()
    return result


# --- shape --------------------------------------------------------------------------------


def test_echo_answer_has_the_openai_shape_and_the_service_clock(start: Any) -> None:
    """An echo answer parses as an OpenAI chat.completion and carries x-service-time-ms."""
    _, base = start(echo_text="pong", **FAST)
    response = httpx.post(f"{base}/v1/chat/completions", json=chat_request("ping"))
    assert response.status_code == 200
    completion = ChatCompletion.model_validate_json(response.content)
    assert completion.choices[0].message.content == "pong"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "fake-model"
    assert completion.id.startswith("chatcmpl-")
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 1
    assert float(response.headers["x-service-time-ms"]) >= 0
    assert response.headers["x-fake-fault"] == "none"


def test_models_healthz_and_stats_answer(start: Any) -> None:
    """GET /v1/models lists the model, /healthz is ok, /stats counts what was served."""
    _, base = start(model="m1", **FAST)
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    models = httpx.get(f"{base}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "m1"
    httpx.post(f"{base}/v1/chat/completions", json=chat_request())
    counted = stats(base)
    assert counted["requests"] == 1 and counted["completed"] == 1
    assert counted["in_flight"] == 0 and counted["max_in_flight_seen"] == 1
    assert len(counted["service_ms"]) == 1
    for key in ("answered_429", "timeouts_injected", "duplicates_sent"):
        assert counted[key] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "not JSON"),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (json.dumps({"messages": [{"role": "user"}]}).encode(), "model"),
        (json.dumps({**chat_request(), "stream": "yes"}).encode(), "stream"),
        (json.dumps({**chat_request(), "stream_options": {}}).encode(), "stream_options"),
        (json.dumps({"model": "m", "messages": ["hi"]}).encode(), "messages[0]"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_field(start: Any, body: bytes, field: str) -> None:
    """A request that is not a chat-completions request gets an OpenAI error naming the field."""
    _, base = start(**FAST)
    response = httpx.post(f"{base}/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert field in ErrorBody.model_validate_json(response.content).error.message


def test_unknown_route_is_a_404(start: Any) -> None:
    """A path the endpoint does not serve is a 404 with an OpenAI error body."""
    _, base = start(**FAST)
    assert httpx.post(f"{base}/v1/completions", json=chat_request()).status_code == 404
    assert httpx.get(f"{base}/nope").status_code == 404


# --- script mode ---------------------------------------------------------------------------


def test_script_mode_answers_steps_in_order_and_a_retry_gets_the_same_step(start: Any) -> None:
    """The step is the count of tool messages: steps come in order, a retry repeats its step."""
    _, base = start(script=SCRIPT, **FAST)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do it"}]
    seen: list[str] = []
    with httpx.Client() as client:
        for step in SCRIPT[:2]:
            request = chat_request(messages=messages)
            first = ChatCompletion.model_validate_json(
                client.post(f"{base}/v1/chat/completions", json=request).content
            )
            retry = ChatCompletion.model_validate_json(
                client.post(f"{base}/v1/chat/completions", json=request).content
            )
            assert first.choices[0].finish_reason == "tool_calls"
            calls = first.choices[0].message.tool_calls
            assert calls is not None and len(calls) == 1
            assert calls[0].function.name == step["tool"]
            assert json.loads(calls[0].function.arguments) == step["args"]
            assert retry.choices[0].message.tool_calls == calls  # same step, same call id
            assert retry.id != first.id  # a new completion, not a duplicate
            seen.append(calls[0].function.name)
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
                {"role": "tool", "tool_call_id": calls[0].id, "content": "ok"},
            ]
        final = ChatCompletion.model_validate_json(
            client.post(f"{base}/v1/chat/completions", json=chat_request(messages=messages)).content
        )
        assert final.choices[0].message == Message(role="assistant", content="done")
        messages.append({"role": "tool", "tool_call_id": "x", "content": "extra"})
        ended = ChatCompletion.model_validate_json(
            client.post(f"{base}/v1/chat/completions", json=chat_request(messages=messages)).content
        )
    assert seen == ["write_file", "read_file"]
    assert ended.choices[0].message.content == "script ended after 3 steps"


def test_a_script_step_must_be_a_tool_call_or_a_final_text() -> None:
    """A step with both or neither of tool and final is refused with a clear message."""
    with pytest.raises(ValidationError, match="either"):
        FakeEndpointConfig.model_validate({"script": [{"tool": "rm", "final": "x"}]})
    with pytest.raises(ValidationError, match="either"):
        FakeEndpointConfig.model_validate({"script": [{"args": {}}]})


# --- faults --------------------------------------------------------------------------------


def test_beyond_the_concurrency_limit_exactly_the_excess_gets_429(start: Any) -> None:
    """With N in service, each of k more requests gets 429 + Retry-After; never > N in flight."""
    limit, extra = 4, 3
    server, base = start(max_concurrency=limit, retry_after_s=2, **FAST)
    server.endpoint.hold()  # admitted requests stay in service until released
    statuses: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def call() -> None:
        response = httpx.post(f"{base}/v1/chat/completions", json=chat_request(), timeout=30)
        with lock:
            statuses.append((response.status_code, response.headers.get("retry-after")))

    threads = [threading.Thread(target=call) for _ in range(limit + extra)]
    for thread in threads:
        thread.start()
    reached(server, lambda s: s["in_flight"] == limit and s["answered_429"] == extra)
    server.endpoint.release()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == [(200, None)] * limit + [(429, "2")] * extra
    final = stats(base)
    assert final["max_in_flight_seen"] == limit
    assert final["in_flight"] == 0 and final["completed"] == limit


def _fault_trace(base: str) -> list[tuple[int, str, str | None]]:
    trace = []
    with httpx.Client() as client:
        for i in range(60):
            # Every third request is a retry of the one before: the duplicate fault's ground.
            content = f"prompt {i - 1 if i % 3 == 2 else i}"
            response = client.post(f"{base}/v1/chat/completions", json=chat_request(content))
            try:
                completion_id = response.json().get("id")
            except ValueError:
                completion_id = None
            trace.append((response.status_code, response.headers["x-fake-fault"], completion_id))
    return trace


def test_the_same_seed_gives_the_same_fault_sequence(start: Any) -> None:
    """Two endpoints with one seed fail the same requests the same way; another seed differs."""
    knobs = {"error_prob": 0.15, "empty_prob": 0.1, "invalid_prob": 0.1, "duplicate_prob": 0.5}
    _, base_a = start(seed=7, **knobs, **FAST)
    _, base_b = start(seed=7, **knobs, **FAST)
    _, base_c = start(seed=8, **knobs, **FAST)
    trace_a, trace_b, trace_c = _fault_trace(base_a), _fault_trace(base_b), _fault_trace(base_c)
    assert trace_a == trace_b
    assert trace_a != trace_c
    kinds = {fault for _, fault, _ in trace_a}
    assert {"none", "error", "empty", "invalid", "duplicate"} <= kinds
    for status, fault, _ in trace_a:
        assert (status >= 500) == (fault == "error")


def test_a_retry_may_be_served_the_earlier_completion_with_the_same_id(start: Any) -> None:
    """With duplicate_prob=1 the second arrival of a request gets the first one's completion."""
    _, base = start(duplicate_prob=1.0, **FAST)
    url = f"{base}/v1/chat/completions"
    first = httpx.post(url, json=chat_request("same"))
    again = httpx.post(url, json=chat_request("same"))
    other = httpx.post(url, json=chat_request("other"))
    assert again.content == first.content
    assert again.headers["x-fake-fault"] == "duplicate"
    assert other.json()["id"] != first.json()["id"]
    assert stats(base)["duplicates_sent"] == 1


def _send_raw(port: int, request: dict[str, Any]) -> socket.socket:
    payload = json.dumps(request).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
        + payload
    )
    return sock


def _give_up_then_read_late(sock: socket.socket) -> tuple[bytes, bytes]:
    sock.settimeout(0.1)
    with pytest.raises(TimeoutError, match="timed out"):
        sock.recv(1)  # the client's own timeout fires: it gives up here
    sock.settimeout(15)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head, body


def test_a_hung_request_answers_a_late_body_after_the_client_gave_up(start: Any) -> None:
    """The hang fault outlives the client's timeout, then a complete completion still arrives."""
    _, base = start(hang_prob=1.0, hang_s=1.0, **FAST)
    with _send_raw(int(base.rsplit(":", 1)[1]), chat_request()) as sock:
        head, body = _give_up_then_read_late(sock)
    assert head.startswith(b"HTTP/1.1 200")
    assert b"x-fake-fault: hang" in head
    ChatCompletion.model_validate_json(body)
    counted = stats(base)
    assert counted["timeouts_injected"] == 1 and counted["late_bodies"] == 1


def test_a_retry_racing_a_hung_original_can_get_the_same_completion(start: Any) -> None:
    """The original hangs, its retry is served; both carry the same id (docs/architecture.md
    §Admission: why a late body must be fenced)."""
    digest = request_digest(chat_request())
    knobs: dict[str, Any] = {"hang_prob": 0.5, "hang_s": 1.0, "duplicate_prob": 1.0, **FAST}
    # The plan is pure, so pick the seed whose first arrival hangs and second is a duplicate.
    seed = next(
        s
        for s in range(1000)
        if plan_request(FakeEndpointConfig(seed=s, **knobs), digest, 1).fault is Fault.HANG
        and plan_request(FakeEndpointConfig(seed=s, **knobs), digest, 2).duplicate
    )
    server, base = start(seed=seed, **knobs)
    with _send_raw(int(base.rsplit(":", 1)[1]), chat_request()) as sock:
        reached(server, lambda s: s["timeouts_injected"] == 1)  # the original drew its hang
        retry = httpx.post(f"{base}/v1/chat/completions", json=chat_request(), timeout=10)
        assert retry.headers["x-fake-fault"] == "duplicate"
        _, late = _give_up_then_read_late(sock)
    assert ChatCompletion.model_validate_json(late).id == retry.json()["id"]
    assert stats(base)["duplicates_sent"] == 1


def test_an_http_client_timeout_on_a_hang_leaves_the_endpoint_answering_late(start: Any) -> None:
    """httpx gives up on a hung request; the endpoint still finishes it and counts a late body."""
    server, base = start(hang_prob=1.0, hang_s=0.5, **FAST)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/chat/completions", json=chat_request(), timeout=0.1)
    # The late body is counted just before its capacity returns: wait for both.
    reached(server, lambda s: s["late_bodies"] == 1 and s["requests_open"] == 0)
    assert stats(base)["in_flight"] == 0


def test_closing_the_server_ends_a_hang_at_once(start: Any) -> None:
    """close() wakes a 30 s hang, so a test never waits for it."""
    server, base = start(hang_prob=1.0, hang_s=30.0, **FAST)
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(httpx.post(f"{base}/v1/chat/completions", json=chat_request()))
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    reached(server, lambda s: s["in_flight"] == 1)
    server.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and outcome


def test_5xx_empty_and_invalid_bodies_are_what_they_claim(start: Any) -> None:
    """An injected 5xx is an OpenAI error; empty and invalid 200s do not parse as completions."""
    url_error = start(error_prob=1.0, **FAST)[1] + "/v1/chat/completions"
    url_empty = start(empty_prob=1.0, **FAST)[1] + "/v1/chat/completions"
    url_invalid = start(invalid_prob=1.0, **FAST)[1] + "/v1/chat/completions"
    error = httpx.post(url_error, json=chat_request())
    assert error.status_code in (500, 502, 503)
    assert ErrorBody.model_validate_json(error.content).error.type == "server_error"
    empty = httpx.post(url_empty, json=chat_request())
    assert empty.status_code == 200 and empty.content == b""
    for i in range(6):
        invalid = httpx.post(url_invalid, json=chat_request(f"p{i}"))
        assert invalid.status_code == 200
        with pytest.raises(ValidationError):
            ChatCompletion.model_validate_json(invalid.content)


# --- the pure plan -------------------------------------------------------------------------


def test_service_times_follow_the_configured_median_p99_and_slow_tail() -> None:
    """Drawn service times have the configured median and p99; the slow share is slow_ms."""
    config = FakeEndpointConfig(
        service_ms_median=40, service_ms_p99=120, slow_prob=0.05, slow_ms=900
    )
    plans = [plan_request(config, request_digest({"i": i}), 1) for i in range(4000)]
    slow = [p for p in plans if p.service_ms == 900]
    fast = sorted(p.service_ms for p in plans if p.service_ms != 900)
    assert 0.03 < len(slow) / len(plans) < 0.07
    assert 36 < statistics.median(fast) < 44
    assert 100 < fast[int(0.99 * len(fast))] < 145


def test_plans_depend_on_seed_request_and_occurrence_only() -> None:
    """The plan is a pure function of (seed, digest, occurrence)."""
    config = FakeEndpointConfig(error_prob=0.5, seed=3)
    digest = request_digest(chat_request())
    assert plan_request(config, digest, 2) == plan_request(config, digest, 2)
    firsts = {plan_request(config, request_digest({"i": i}), 1).fault for i in range(50)}
    assert firsts == {Fault.NONE, Fault.ERROR}
    assert not plan_request(config.model_copy(update={"duplicate_prob": 1.0}), digest, 1).duplicate


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"service_ms_median": 50, "service_ms_p99": 10}, "service_ms_p99"),
        ({"error_prob": 0.6, "hang_prob": 0.6}, "<= 1"),
        ({"slow_prob": 1.5}, "slow_prob"),
        ({"script": []}, "at least one step"),
    ],
)
def test_an_incoherent_config_is_refused(knobs: dict[str, Any], message: str) -> None:
    """Impossible knobs are refused with a message naming them."""
    with pytest.raises(ValidationError, match=message):
        FakeEndpointConfig(**knobs)


# --- the command -----------------------------------------------------------------------------


def test_help_explains_every_fault() -> None:
    """--help names each fault flag."""
    result = CliRunner().invoke(fake_endpoint, ["--help"])
    assert result.exit_code == 0
    for flag in (
        "--max-concurrency",
        "--retry-after-s",
        "--service-ms-p99",
        "--slow-prob",
        "--hang-prob",
        "--error-prob",
        "--empty-prob",
        "--invalid-prob",
        "--duplicate-prob",
        "--script",
        "--seed",
    ):
        assert flag in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--service-ms-median", "90", "--service-ms-p99", "10"], "--service-ms-p99 must be"),
        (["--slow-prob", "1.5"], "--slow-prob: Input should be less than or equal to 1"),
        (["--script", "/nonexistent/steps.json"], "cannot read --script"),
    ],
)
def test_bad_flags_are_one_clear_line(args: list[str], message: str) -> None:
    """Bad input exits 2 with a message naming the problem, no traceback."""
    result = CliRunner().invoke(fake_endpoint, ["--port", "0", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_a_script_file_that_is_not_a_list_of_steps_is_refused(tmp_path: Path) -> None:
    """A script that is not JSON, or not a list, or has a bad step, is named in the error."""
    for text, message in (
        ("{", "not JSON"),
        ("{}", "non-empty JSON list"),
        ('[{"tool": "x", "final": "y"}]', "either"),
    ):
        path = tmp_path / "steps.json"
        path.write_text(text)
        result = CliRunner().invoke(fake_endpoint, ["--port", "0", "--script", str(path)])
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_the_command_serves_a_script_over_http(tmp_path: Path) -> None:
    """`python -m ops.testing.fake_endpoint.cli --port 0 --script F` serves the script."""
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(SCRIPT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops.testing.fake_endpoint.cli",
            "--port",
            "0",
            "--script",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[4],
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "script of 3 steps" in banner
        base = banner.split()[3].removesuffix("/v1")
        answer = httpx.post(f"{base}/v1/chat/completions", json=chat_request(), timeout=10)
        calls = ChatCompletion.model_validate_json(answer.content).choices[0].message.tool_calls
        assert calls is not None and calls[0].function.name == "write_file"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
