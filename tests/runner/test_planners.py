"""The OpenAI-compatible planner against a real fault-injecting endpoint and a real desk."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from runner.admission.desk import AdmissionDesk
from runner.agent.planners import ChatPlanner, PlannerError
from runner.jobs.models import OpenAIPlanner, StepRecord

SCRIPT = (
    ScriptStep(tool="read_file", args={"path": "README"}),
    ScriptStep(tool="write_file", args={"path": "a.txt", "content": "x"}),
    ScriptStep(tool="run_tests", args={}),
    ScriptStep(final="done"),
)


@pytest.fixture
def endpoint() -> Iterator[Any]:
    servers: list[FakeEndpointServer] = []

    def start(**knobs: Any) -> str:
        knobs = {"service_ms_median": 5, "service_ms_p99": 10, **knobs}
        server, port = serve(FakeEndpointConfig(script=SCRIPT, **knobs))
        servers.append(server)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for server in servers:
        server.close()


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


def make(
    base_url: str,
    client: redis.Redis,
    *,
    bound: int = 2,
    timeout_s: float = 5.0,
    eval_run: str | None = None,
) -> tuple[ChatPlanner, AdmissionDesk]:
    spec = OpenAIPlanner(
        kind="openai",
        base_url=base_url,
        model="fake-model",
        prompt="fix it",
        request_timeout_s=timeout_s,
        admission_bound=bound,
    )
    desk = AdmissionDesk(client, eval_run or f"run-{uuid.uuid4().hex[:8]}", bound)
    return ChatPlanner(spec, desk, job_id="job-1", attempt=1, deadline_s=60), desk


def test_scripted_conversation_yields_each_tool_call(
    endpoint: Any, redis_client: redis.Redis
) -> None:
    """The model's tool calls become steps in order; the final answer ends the plan."""
    planner, desk = make(endpoint(), redis_client)
    assert drive(planner) == ["read_file", "write_file", "run_tests"]
    assert planner.final == "done"
    stats = desk.stats()
    assert stats["in_flight"] == 0 and stats["committed"] == 4


def test_timeout_then_late_body_is_rejected_as_stale(
    endpoint: Any, redis_client: redis.Redis
) -> None:
    """A request that times out locally answers late: the late body is fenced at the desk
    (stale), never becomes a step, and each step still commits once."""
    url = endpoint(hang_prob=0.5, hang_s=1.5, seed=1)
    planner, desk = make(url, redis_client, timeout_s=0.5)
    tools = drive(planner)
    assert tools == ["read_file", "write_file", "run_tests"]
    assert planner.stats["timeouts"] >= 1
    # Wait (bounded) for the late bodies to arrive and be judged.
    import time

    give_up = time.monotonic() + 10
    while (
        planner.stats["stale_rejections"] < planner.stats["timeouts"] and time.monotonic() < give_up
    ):
        time.sleep(0.05)
    assert planner.stats["stale_rejections"] == planner.stats["timeouts"]
    assert planner.stats["stale_commits_BUG"] == 0
    stats = desk.stats()
    assert stats["committed"] == 4 and stats["in_flight"] == 0


def test_429_reacquires_and_never_exceeds_the_bound(
    endpoint: Any, redis_client: redis.Redis
) -> None:
    """Two planners of one eval-run share a desk of bound 2 against an endpoint that takes
    one request at a time: 429s give the lease back and re-acquire; the bound holds."""
    import threading

    url = endpoint(max_concurrency=1, retry_after_s=0, service_ms_median=40, service_ms_p99=80)
    run = f"run-{uuid.uuid4().hex[:8]}"
    planners = [make(url, redis_client, bound=2, eval_run=run) for _ in range(3)]
    for n, (planner, _) in enumerate(planners):
        planner.job_id = f"job-{n}"
    results: dict[int, list[str]] = {}
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(planners[0][1].stats()["in_flight"])
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, drive(planners[n][0])))
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    done.set()
    sampler.join()
    assert all(results[n] == ["read_file", "write_file", "run_tests"] for n in range(3))
    assert sum(p.stats["http_429"] for p, _ in planners) >= 1
    assert max(seen) <= 2 and min(seen) >= 0
    assert planners[0][1].stats()["in_flight"] == 0


def test_protocol_errors_are_counted_apart(endpoint: Any, redis_client: redis.Redis) -> None:
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
    planner.ends_at = planner.clock() + 3
    with pytest.raises(PlannerError):
        drive(planner)
    assert desk.stats()["in_flight"] == 0
