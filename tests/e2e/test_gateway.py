"""Acceptance: 16 agents of one eval-run, bound 4, through ``slotrunner gateway`` (a real
process) against the fake endpoint in slow-tail mode, each agent the official ``openai``
client on its own thread, the desk in real Redis (docs/architecture.md §Gateway, I6)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import redis

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, plan_request, request_digest
from ops.testing.fake_endpoint.server import serve
from runner.core.settings import Settings
from tests.support.gateway import Gateway, client, desk_stats, new_run, upstream

AGENTS = 16
BOUND = 4
MAX_WAITING = 4  # the desk's queue: beyond it a request is refused at once (queue_full)
TURNS = 3
TIMEOUT_S = 0.3  # the local timeout; a slow-tail request takes SLOW_MS
SLOW_MS = 700.0


@dataclass
class Turn:
    """One completion an agent asked for: its request, and what it was told."""

    body: dict[str, Any]
    timeouts: int = 0  # 504s: each of those tries reached the endpoint and was fenced
    delivered: str | None = None  # the completion id the agent got


@dataclass
class Agent:
    """One agent's own record."""

    turns: list[Turn] = field(default_factory=list)
    seen: Counter[int] = field(default_factory=Counter)  # HTTP status of each failed try
    error: BaseException | None = None


def run_agent(number: int, credential: Any, record: Agent, start: threading.Barrier) -> None:
    agent = client(credential, timeout=30)
    start.wait()
    try:
        for turn in range(TURNS):
            body: dict[str, Any] = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": f"agent {number} turn {turn}"}],
            }
            if number % 2:
                body["stream"] = True
            record.turns.append(Turn(body))
            while record.turns[-1].delivered is None:
                try:
                    record.turns[-1].delivered = complete(agent, body)
                except (openai.RateLimitError, openai.InternalServerError) as exc:
                    record.seen[exc.status_code] += 1  # 429 refused, 504 timed out: try again
                    record.turns[-1].timeouts += exc.status_code == 504
                    time.sleep(0.05)
    except BaseException as exc:
        record.error = exc


def complete(agent: openai.OpenAI, body: dict[str, Any]) -> str:
    """One completion, streamed or not: its id."""
    if body.get("stream"):
        chunks = list(agent.chat.completions.create(**body))
        ids = {chunk.id for chunk in chunks}
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(ids) == 1 and text == "ok"
        return str(ids.pop())
    completion = agent.chat.completions.create(**body)
    assert completion.choices[0].message.content == "ok"
    return str(completion.id)


def completion_id(config: FakeEndpointConfig, body: dict[str, Any], occurrence: int) -> str:
    return plan_request(config, request_digest(body), occurrence).completion_id


def test_sixteen_agents_stay_within_the_bound_and_never_see_a_late_body(
    settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    config = FakeEndpointConfig(
        seed=13,
        service_ms_median=15.0,
        service_ms_p99=40.0,
        slow_prob=0.15,
        slow_ms=SLOW_MS,
    )
    server, port = serve(config)
    gateway = Gateway.process(
        settings, redis_client, tmp_path / "logs", "--max-waiting", str(MAX_WAITING)
    )
    try:
        run = new_run()
        credentials = [
            gateway.mint(
                upstream(port),
                eval_run=run,
                bound=BOUND,
                job_id=f"job-{n}",
                request_timeout_s=TIMEOUT_S,
                admission_wait_s=10.0,
            )
            for n in range(AGENTS)
        ]
        records = [Agent() for _ in range(AGENTS)]
        start = threading.Barrier(AGENTS)
        threads = [
            threading.Thread(target=run_agent, args=(n, credentials[n], records[n], start))
            for n in range(AGENTS)
        ]
        # The endpoint holds what it takes until the run is full, its queue is full, more
        # were refused, and the held four timed out: each of those is then certain.
        server.endpoint.hold()
        for thread in threads:
            thread.start()
        try:
            gateway.wait_for(
                lambda g: (
                    g["refused_by_reason"].get("queue_full", 0) >= AGENTS - BOUND - MAX_WAITING
                    and g["outcomes"]["timeout"] >= BOUND
                )
            )
            assert server.endpoint.stats()["requests_open"] == BOUND
        finally:
            server.endpoint.release()
        for thread in threads:
            thread.join(90)
        assert [r.error for r in records] == [None] * AGENTS
        gateway.wait_for(lambda g: g["leases_held"] == 0)  # every late body has come
        counted = server.endpoint.stats()
        desk = desk_stats(redis_client, run, BOUND)
        report = gateway.stats()["gateway"]
        metrics = httpx.get(f"{gateway.root}/metrics").text
    finally:
        gateway.stop()
        server.close()

    print(  # the report, as pytest -s shows it
        f"gateway: {report['outcomes']}, refused by reason {report['refused_by_reason']}, "
        f"stale {report['stale_completions']}; endpoint: max open "
        f"{counted['max_requests_open_seen']}, completed {counted['completed']}"
    )
    # I6, counted by the endpoint itself: never more than the bound at once.
    assert counted["max_requests_open_seen"] <= BOUND and counted["requests_open"] == 0
    turns = [turn for r in records for turn in r.turns]
    delivered = [turn.delivered for turn in turns]
    assert len(delivered) == AGENTS * TURNS and len(set(delivered)) == len(delivered)
    # No late body reached an agent: each got the answer to its last try, never one to an
    # earlier try that timed out (the endpoint's ids are its seed, request and occurrence)...
    assert [turn.delivered for turn in turns] == [
        completion_id(config, turn.body, turn.timeouts + 1) for turn in turns
    ]
    # ...and every completion the endpoint made went to exactly one agent or was stale.
    stale = report["stale_completions"]
    assert stale >= BOUND and counted["completed"] == len(delivered) + stale
    assert desk["stale_completion"] == stale and desk["committed"] == len(delivered)
    assert report["outcomes"]["timeout"] == stale == sum(r.seen[504] for r in records)
    assert report["late_failures"] == 0 and desk["in_flight"] == 0
    # Refusals are counted (desk and gateway alike) and reported, each one an agent saw.
    refused = sum(r.seen[429] for r in records)
    assert refused >= AGENTS - BOUND - MAX_WAITING
    assert report["outcomes"]["refused"] == desk["refused"] == refused
    assert sum(report["refused_by_reason"].values()) == refused
    assert 'slotrunner_gateway_admission_refused_total{reason="queue_full"} ' in metrics
    assert f"slotrunner_gateway_stale_completions_total {float(stale)}" in metrics
