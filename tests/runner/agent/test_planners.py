"""The OpenAI-compatible planner against a real fault-injecting endpoint and a real desk."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from runner.admission.desk import AdmissionDesk
from runner.agent.planners import ChatPlanner, PlannerError
from runner.jobs.models import OpenAIPlanner, StepRecord
from tests.support.clock import FakeClock

SCRIPT = (
    ScriptStep(tool="read_file", args={"path": "README"}),
    ScriptStep(tool="write_file", args={"path": "a.txt", "content": "x"}),
    ScriptStep(tool="run_tests", args={}),
    ScriptStep(final="done"),
)


class Endpoints:
    """The fake endpoints of one test: calling it starts one and returns its base URL."""

    def __init__(self) -> None:
        self.servers: list[FakeEndpointServer] = []

    def __call__(self, **knobs: Any) -> str:
        knobs = {"service_ms_median": 5, "service_ms_p99": 10, **knobs}
        server, port = serve(FakeEndpointConfig(script=SCRIPT, **knobs))
        self.servers.append(server)
        return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def endpoint() -> Iterator[Endpoints]:
    endpoints = Endpoints()
    yield endpoints
    for server in endpoints.servers:
        server.close()


def endpoint_stats(base_url: str) -> dict[str, Any]:
    """The endpoint's own counts, read over HTTP: a witness independent of the desk."""
    stats: dict[str, Any] = httpx.get(base_url.removesuffix("/v1") + "/stats").json()
    return stats


def drive(planner: ChatPlanner) -> list[str]:
    """Run the planner as the agent loop would: every step 'succeeds'."""
    tools = []
    for step in planner.steps():
        tools.append(step.tool)
        planner.observe(
            StepRecord(
                index=len(tools) - 1,
                tool=step.tool,
                idempotency_key=None,
                outcome="applied",
                result={"ok": True},
            )
        )
    planner.close()
    return tools


def drive_all(planners: list[ChatPlanner]) -> dict[int, list[str]]:
    """Drive each planner on its own thread, as workers of one eval-run would."""
    results: dict[int, list[str]] = {}

    def run(n: int) -> None:
        results[n] = drive(planners[n])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(planners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def make(
    base_url: str,
    client: redis.Redis,
    *,
    bound: int = 2,
    timeout_s: float = 5.0,
    eval_run: str | None = None,
    job_id: str = "job-1",
    **desk_knobs: Any,
) -> tuple[ChatPlanner, AdmissionDesk]:
    spec = OpenAIPlanner(
        kind="openai",
        base_url=base_url,
        model="fake-model",
        prompt="fix it",
        request_timeout_s=timeout_s,
        admission_bound=bound,
    )
    desk = AdmissionDesk(client, eval_run or f"run-{uuid.uuid4().hex[:8]}", bound, **desk_knobs)
    return ChatPlanner(spec, desk, job_id=job_id, attempt=1, deadline_s=60), desk


def test_scripted_conversation_yields_each_tool_call(
    endpoint: Endpoints, redis_client: redis.Redis
) -> None:
    """The model's tool calls become steps in order; the final answer ends the plan."""
    planner, desk = make(endpoint(), redis_client)
    assert drive(planner) == ["read_file", "write_file", "run_tests"]
    assert planner.final == "done"
    stats = desk.stats()
    assert stats["in_flight"] == 0 and stats["committed"] == 4


def test_timeout_then_late_body_is_rejected_as_stale(
    endpoint: Endpoints, redis_client: redis.Redis
) -> None:
    """A request that times out locally answers late: the late body is fenced at the desk
    (stale), never becomes a step, and each step still commits once."""
    url = endpoint(hang_prob=0.5, hang_s=1.5, seed=1)
    planner, desk = make(url, redis_client, timeout_s=0.5)
    tools = drive(planner)
    assert tools == ["read_file", "write_file", "run_tests"]
    assert planner.stats["timeouts"] >= 1
    # Returns once every request still out has answered and its late body was judged.
    planner.close(wait=True)
    assert planner.stats["late_bodies"] == planner.stats["timeouts"]
    assert planner.stats["stale_rejections"] == planner.stats["timeouts"]
    assert planner.stats["stale_commits_BUG"] == 0
    stats = desk.stats()
    assert stats["committed"] == 4 and stats["in_flight"] == 0


def test_the_endpoint_never_serves_more_requests_than_the_bound(
    endpoint: Endpoints, redis_client: redis.Redis
) -> None:
    """Three planners of one eval-run share a desk of bound 2; the endpoint has no limit of
    its own and holds every request it takes: two requests reach it, the third planner
    waits at the desk, and the endpoint's own count never passes the bound (I6, counted
    outside the desk)."""
    url = endpoint()
    server = endpoint.servers[-1].endpoint
    server.hold()
    waiting = threading.Event()

    def sleep_waiting(seconds: float) -> None:
        # The desk sleeps only between polls of a caller queued for capacity.
        waiting.set()
        time.sleep(seconds)

    run = f"run-{uuid.uuid4().hex[:8]}"
    planners = [
        make(url, redis_client, eval_run=run, job_id=f"job-{n}", sleep=sleep_waiting)[0]
        for n in range(3)
    ]
    results: dict[int, list[str]] = {}
    driver = threading.Thread(target=lambda: results.update(drive_all(planners)))
    driver.start()
    try:
        server.wait_for(lambda stats: stats["requests_open"] >= 2, timeout_s=10)
        assert waiting.wait(10), "the desk let a third request out past its bound of 2"
        assert endpoint_stats(url)["requests_open"] == 2
    finally:
        server.release()
        driver.join(60)
    assert results == {n: ["read_file", "write_file", "run_tests"] for n in range(3)}
    counted = endpoint_stats(url)
    assert counted["max_requests_open_seen"] == 2 and counted["requests_open"] == 0
    assert counted["completed"] == 12


def test_429_reacquires_and_never_exceeds_the_bound(
    endpoint: Endpoints, redis_client: redis.Redis
) -> None:
    """Three planners of one eval-run share a desk of bound 2 against an endpoint that
    takes one request at a time: 429s give the lease back and re-acquire; the endpoint
    never has more than 2 requests open, 429s included."""
    url = endpoint(max_concurrency=1, retry_after_s=0, service_ms_median=40, service_ms_p99=80)
    server = endpoint.servers[-1].endpoint
    server.hold()  # the first request admitted stays in service: the next one gets a 429
    run = f"run-{uuid.uuid4().hex[:8]}"
    planners = [make(url, redis_client, eval_run=run, job_id=f"job-{n}") for n in range(3)]
    results: dict[int, list[str]] = {}
    driver = threading.Thread(target=lambda: results.update(drive_all([p for p, _ in planners])))
    driver.start()
    try:
        server.wait_for(lambda stats: stats["answered_429"] >= 1, timeout_s=10)
    finally:
        server.release()
        driver.join(60)
    assert results == {n: ["read_file", "write_file", "run_tests"] for n in range(3)}
    assert sum(p.stats["http_429"] for p, _ in planners) >= 1
    counted = endpoint_stats(url)
    assert counted["max_requests_open_seen"] <= 2 and counted["requests_open"] == 0
    assert counted["max_in_flight_seen"] == 1
    assert planners[0][1].stats()["in_flight"] == 0


def test_protocol_errors_are_counted_apart(endpoint: Endpoints, redis_client: redis.Redis) -> None:
    """Empty and invalid bodies are protocol errors, retried, and never become steps."""
    url = endpoint(empty_prob=0.3, invalid_prob=0.3, seed=11)
    planner, _ = make(url, redis_client)
    assert drive(planner) == ["read_file", "write_file", "run_tests"]
    assert planner.stats["protocol_errors"] >= 1
    assert planner.stats["transport_errors"] == 0


def test_endpoint_down_is_a_clear_planner_error(redis_client: redis.Redis) -> None:
    """No endpoint at all: the planner gives up with a PlannerError, not a hang."""
    from ops.testing.stack import free_port

    planner, desk = make(f"http://127.0.0.1:{free_port()}/v1", redis_client)
    # The planner's back-off between refused connects moves an injected clock, not time.
    clock = FakeClock()
    planner.clock, planner.sleep, planner.ends_at = clock, clock.sleep, clock() + 3
    with pytest.raises(PlannerError, match="no usable completion within the deadline"):
        drive(planner)
    # 0.5 s of back-off after each refused connect: the 3 s deadline ends it after 6.
    assert planner.stats["transport_errors"] == clock.sleeps == 6
    assert planner.stats["commits"] == 0 and clock() >= planner.ends_at
    assert desk.stats()["in_flight"] == 0
