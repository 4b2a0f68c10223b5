"""The admission gateway (runner/gateway/) over real HTTP, a real desk in Redis and the
real fake endpoint, driven by the official ``openai`` client as an agent drives it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, Fault, plan_request, request_digest
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from ops.testing.stack import free_port
from runner.core import keys
from runner.core.settings import Settings
from runner.gateway import revoke_credential
from runner.gateway.app import GatewayConfigError, create_app
from tests.support.gateway import Gateway, client, desk_stats, new_run, upstream

HI = [{"role": "user", "content": "hi"}]
FAST = {"service_ms_median": 2.0, "service_ms_p99": 5.0}


@pytest.fixture
def fakes() -> Iterator[list[FakeEndpointServer]]:
    servers: list[FakeEndpointServer] = []
    yield servers
    for server in servers:
        server.close()


def fake(fakes: list[FakeEndpointServer], **knobs: Any) -> tuple[FakeEndpointServer, str]:
    server, port = serve(FakeEndpointConfig(**{**FAST, **knobs}))
    fakes.append(server)
    return server, upstream(port)


@pytest.fixture
def gateway(settings: Settings, redis_client: redis.Redis) -> Iterator[Gateway]:
    gw = Gateway.in_process(settings, redis_client, api_keys={"UPSTREAM_KEY": "sk-upstream"})
    yield gw
    gw.stop()


def ask(agent: openai.OpenAI, content: str = "hi") -> Any:
    return agent.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": content}]
    )


# -- credentials ---------------------------------------------------------------------------


def test_a_minted_credential_reaches_the_upstream_and_only_its_hash_is_stored(
    gateway: Gateway, fakes: list[FakeEndpointServer], redis_client: redis.Redis
) -> None:
    server, url = fake(fakes, echo_text="hello there")
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=2)
    assert credential.gateway_url == gateway.url and credential.secret not in repr(credential)
    completion = ask(client(credential))
    assert completion.choices[0].message.content == "hello there"
    stored = redis_client.keys(keys.gateway_credential("*"))
    assert stored and not any(credential.secret in k for k in stored)
    assert all(credential.secret not in (redis_client.get(k) or "") for k in stored)
    assert 0 < redis_client.pttl(keys.gateway_credential(_digest(credential.secret))) <= 120_000
    stats = desk_stats(redis_client, run, 2)
    assert stats["acquired"] == stats["released"] == stats["committed"] == 1
    assert stats["in_flight"] == 0 and server.endpoint.stats()["completed"] == 1


def _digest(secret: str) -> str:
    from runner.gateway.credentials import digest

    return digest(secret)


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Basic dTpw", "Bearer sk-not-ours", "Bearer srgw-unknown"]
)
def test_a_missing_or_unknown_credential_is_401_and_nothing_is_forwarded(
    gateway: Gateway, fakes: list[FakeEndpointServer], authorization: str | None
) -> None:
    server, _ = fake(fakes)
    headers = {} if authorization is None else {"authorization": authorization}
    response = httpx.post(
        f"{gateway.url}/chat/completions",
        json={"model": "fake-model", "messages": HI},
        headers=headers,
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert server.endpoint.stats()["requests"] == 0
    assert gateway.outcomes()["unauthorized"] == 1


def test_a_revoked_credential_is_refused_like_an_unknown_one(
    gateway: Gateway, fakes: list[FakeEndpointServer], redis_client: redis.Redis
) -> None:
    server, url = fake(fakes)
    credential = gateway.mint(url, eval_run=new_run(), bound=1)
    ask(client(credential))
    assert revoke_credential(redis_client, credential.secret)
    with pytest.raises(openai.AuthenticationError):
        ask(client(credential))
    assert server.endpoint.stats()["requests"] == 1


def test_a_superseded_attempt_is_403_and_nothing_is_forwarded(
    gateway: Gateway, fakes: list[FakeEndpointServer], redis_client: redis.Redis
) -> None:
    server, url = fake(fakes)
    job = f"job-{new_run()}"
    credential = gateway.mint(url, eval_run=new_run(), bound=1, job_id=job, attempt=1)
    redis_client.set(keys.job_attempt(job), 2)
    with pytest.raises(openai.PermissionDeniedError, match="superseded by attempt 2"):
        ask(client(credential))
    assert server.endpoint.stats()["requests"] == 0


def test_the_upstream_key_is_the_gateways_never_the_agents(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    """The upstream requires its key: a grant naming the gateway's key gets through; one
    naming none is refused by the upstream (the agent's credential is not sent on); one
    naming a key the gateway lacks is refused before anything is sent."""
    server, url = fake(fakes, api_key="sk-upstream")
    run = new_run()
    keyed = gateway.mint(url, eval_run=run, bound=1, api_key_env="UPSTREAM_KEY")
    assert ask(client(keyed)).choices[0].message.content == "ok"
    unkeyed = gateway.mint(url, eval_run=run, bound=1)
    with pytest.raises(openai.AuthenticationError):
        ask(client(unkeyed))
    lacking = gateway.mint(url, eval_run=run, bound=1, api_key_env="NOT_SET_ON_THE_GATEWAY")
    with pytest.raises(openai.InternalServerError, match="no upstream key"):
        ask(client(lacking))
    counted = server.endpoint.stats()
    assert counted["requests"] == 2 and counted["answered_401"] == 1
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0


def test_a_body_that_is_not_a_json_object_is_400_and_nothing_is_forwarded(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    server, url = fake(fakes)
    credential = gateway.mint(url, eval_run=new_run(), bound=1)
    auth = {"authorization": f"Bearer {credential.secret}"}
    for body in (b"not json", b"[1, 2]"):
        response = httpx.post(f"{gateway.url}/chat/completions", content=body, headers=auth)
        assert response.status_code == 400
    assert server.endpoint.stats()["requests"] == 0


# -- admission -------------------------------------------------------------------------------


def test_a_request_not_admitted_within_its_wait_is_429_with_retry_after(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    """Bound 1, the one lease held at the upstream: the next request waits its admission
    wait at the desk, then is refused 429 with Retry-After; it never reaches the upstream."""
    server, url = fake(fakes)
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=1, admission_wait_s=0.2)
    server.endpoint.hold()
    first = threading.Thread(target=ask, args=(client(credential),))
    first.start()
    try:
        server.endpoint.wait_for(lambda s: s["requests_open"] == 1, timeout_s=10)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(client(credential), "second")
        assert refused.value.response.headers["retry-after"] == "1"
        assert refused.value.code == "admission_deadline"
        assert server.endpoint.stats()["requests"] == 1
    finally:
        server.endpoint.release()
        first.join(30)
    assert desk_stats(gateway.redis, run, 1)["refused"] == 1
    assert gateway.stats()["gateway"]["refused_by_reason"] == {"deadline": 1}
    metrics = httpx.get(f"{gateway.root}/metrics").text
    assert 'slotrunner_gateway_admission_refused_total{reason="deadline"} 1.0' in metrics


def test_an_upstream_429_gives_the_capacity_back_and_is_passed_on(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    """The upstream takes one request at a time and holds it; the desk (bound 2) admits a
    second, which the upstream answers 429: the agent gets that 429 and its Retry-After,
    and the desk counts only the held request while it is still out."""
    server, url = fake(fakes, max_concurrency=1, retry_after_s=7)
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=2)
    server.endpoint.hold()
    first = threading.Thread(target=ask, args=(client(credential),))
    first.start()
    try:
        server.endpoint.wait_for(lambda s: s["in_flight"] == 1, timeout_s=10)
        with pytest.raises(openai.RateLimitError) as limited:
            ask(client(credential), "second")
        assert limited.value.response.headers["retry-after"] == "7"
        assert limited.value.code == "rate_limit"  # the upstream's own error, passed on
        stats = desk_stats(gateway.redis, run, 2)
        assert stats["in_flight"] == 1 and stats["acquired"] == 2 and stats["released"] == 1
    finally:
        server.endpoint.release()
        first.join(30)
    assert desk_stats(gateway.redis, run, 2)["in_flight"] == 0
    assert gateway.outcomes()["upstream_429"] == 1


def test_past_the_local_timeout_the_lease_expires_and_the_late_body_is_never_delivered(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    """Request A hangs at the upstream past its local timeout: A gets a 504, its lease is
    expired but still counted while A is out; B, sent meanwhile on the same client, gets
    its own answer; when A's late body comes it is judged stale at the desk, counted,
    dropped, and only then is its capacity given back."""
    a, b = "question A", "question B"
    seed = _seed_where_only_a_hangs(a, b)
    server, url = fake(fakes, seed=seed, hang_prob=0.5, hang_s=1.0)
    run = new_run()
    credential = gateway.mint(url, eval_run=run, bound=2, request_timeout_s=0.3)
    agent = client(credential)
    with pytest.raises(openai.InternalServerError) as timed_out:
        ask(agent, a)
    assert timed_out.value.status_code == 504
    stats = desk_stats(gateway.redis, run, 2)
    assert stats["expired"] == 1 and stats["in_flight"] == 1  # fenced, still counted
    answer = ask(agent, b)
    assert answer.id == _completion_id(seed, b, 1)
    gateway.wait_for(lambda g: g["stale_completions"] == 1 and g["leases_held"] == 0)
    stats = desk_stats(gateway.redis, run, 2)
    assert stats["stale_completion"] == 1 and stats["in_flight"] == 0
    assert stats["committed"] == 1  # B only: A's late body committed nothing
    assert server.endpoint.stats()["late_bodies"] == 1
    assert gateway.outcomes()["timeout"] == 1 and gateway.outcomes()["completed"] == 1


def _body(content: str) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}]}


def _completion_id(seed: int, content: str, occurrence: int) -> str:
    config = FakeEndpointConfig(seed=seed, hang_prob=0.5)
    return plan_request(config, request_digest(_body(content)), occurrence).completion_id


def _seed_where_only_a_hangs(a: str, b: str) -> int:
    """A seed under which the first A hangs and the first B does not (faults are pure)."""
    for seed in range(1000):
        config = FakeEndpointConfig(seed=seed, hang_prob=0.5)
        fate_a = plan_request(config, request_digest(_body(a)), 1).fault
        fate_b = plan_request(config, request_digest(_body(b)), 1).fault
        if fate_a is Fault.HANG and fate_b is Fault.NONE:
            return seed
    raise AssertionError("no seed found")


def test_an_upstream_5xx_or_a_dead_upstream_is_502_and_the_capacity_comes_back(
    gateway: Gateway, fakes: list[FakeEndpointServer]
) -> None:
    _, url = fake(fakes, error_prob=1.0)
    run = new_run()
    failing = gateway.mint(url, eval_run=run, bound=1)
    with pytest.raises(openai.InternalServerError) as bad:
        ask(client(failing))
    assert bad.value.status_code == 502 and bad.value.code is not None
    assert bad.value.code.startswith("upstream_5")
    dead = gateway.mint(upstream(free_port()), eval_run=run, bound=1)
    with pytest.raises(openai.InternalServerError) as unreachable:
        ask(client(dead))
    assert unreachable.value.status_code == 502
    assert unreachable.value.code == "upstream_unreachable"
    assert desk_stats(gateway.redis, run, 1)["in_flight"] == 0
    outcomes = gateway.outcomes()
    assert outcomes["upstream_5xx"] == 1 and outcomes["upstream_unreachable"] == 1


# -- binding ---------------------------------------------------------------------------------


def test_off_loopback_it_refuses_to_start_without_a_token_and_guards_its_counts(
    settings: Settings, redis_client: redis.Redis, fakes: list[FakeEndpointServer]
) -> None:
    with pytest.raises(GatewayConfigError, match="without a token"):
        create_app(settings, bind_host="0.0.0.0", redis_client=redis_client)
    guarded = settings.with_(token="host-token")
    create_app(guarded, bind_host="0.0.0.0", redis_client=redis_client)
    # Served on loopback here, configured as it would be off it: the token guards the
    # counts, and the chat route still takes only an agent's credential.
    gw = Gateway.in_process(guarded, redis_client)
    try:
        assert httpx.get(f"{gw.root}/metrics").status_code == 401
        assert httpx.get(f"{gw.root}/stats", headers={"x-slotrunner-token": "x"}).status_code == 401
        assert gw.stats({"x-slotrunner-token": "host-token"})["gateway"]["leases_held"] == 0
        _, url = fake(fakes)
        with pytest.raises(openai.AuthenticationError):
            ask(openai.OpenAI(base_url=gw.url, api_key="host-token", max_retries=0))
        assert ask(client(gw.mint(url, eval_run=new_run(), bound=1))).choices
    finally:
        gw.stop()
