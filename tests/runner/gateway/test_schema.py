"""The gateway's own OpenAPI document (runner/gateway/schema.py): served at
/openapi.json, every reference resolves, and the gateway's real answers (a completion,
its refusals) are what it documents; schemathesis finds nothing on its doors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
import redis
import schemathesis
import schemathesis.engine
from schemathesis.engine import Status, events

from ops.testing.fake_endpoint.plan import FakeEndpointConfig
from ops.testing.fake_endpoint.server import serve
from runner.core.settings import Settings
from tests.support.gateway import Gateway, new_run, upstream


@pytest.fixture
def gateway(settings: Settings, redis_client: redis.Redis) -> Iterator[Gateway]:
    gw = Gateway.in_process(settings, redis_client, api_keys={"UPSTREAM_KEY": "sk-upstream"})
    yield gw
    gw.stop()


def published(gateway: Gateway) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{gateway.root}/openapi.json", timeout=10).json()
    return doc


def conforms(doc: dict[str, Any], component: str, body: Any) -> bool:
    validator = jsonschema_rs.validator_for(
        {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
    )
    return bool(validator.is_valid(body))


def test_every_reference_resolves(gateway: Gateway) -> None:
    doc = published(gateway)
    text = json.dumps(doc)
    names = {part.split('"')[0] for part in text.split('"#/components/schemas/')[1:]}
    assert names <= set(doc["components"]["schemas"]), names - set(doc["components"]["schemas"])
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"agentCredential": []}]
    assert {"200", "400", "401", "403", "413", "429", "502", "503", "504"} <= set(chat["responses"])


def test_real_answers_are_the_documented_ones(gateway: Gateway) -> None:
    """A completion conforms to ChatCompletion; no credential, a non-JSON body and an
    admission refusal are OpenAI error objects, as documented."""
    doc = published(gateway)
    endpoint, port = serve(FakeEndpointConfig(service_ms_median=2.0, service_ms_p99=5.0))
    try:
        credential = gateway.mint(upstream(port), eval_run=new_run(), bound=1)
        auth = {"authorization": f"Bearer {credential.secret}"}
        url = f"{gateway.url}/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        ok = httpx.post(url, json=body, headers=auth, timeout=30)
        assert ok.status_code == 200 and conforms(doc, "ChatCompletion", ok.json()), ok.text
        no_credential = httpx.post(url, json=body, timeout=30)
        assert no_credential.status_code == 401 and "www-authenticate" in no_credential.headers
        not_json = httpx.post(url, content=b"{", headers=auth, timeout=30)
        assert not_json.status_code == 400
        for refusal in (no_credential, not_json):
            assert conforms(doc, "ErrorBody", refusal.json()), refusal.text
        assert conforms(doc, "Health", httpx.get(f"{gateway.root}/healthz").json())
    finally:
        endpoint.close()


def test_schemathesis_finds_nothing_on_its_doors(gateway: Gateway) -> None:
    """Every check over every operation, without a credential (each /v1 call must then
    be refused 401 as documented) and on the ops routes."""
    config = schemathesis.Config()
    config.update(seed=15, max_failures=None)
    config.projects.override.generation.update(max_examples=15, deterministic=True)
    schema = schemathesis.openapi.from_url(f"{gateway.root}/openapi.json", config=config)
    problems = []
    requests = 0
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            requests += len(event.recorder.interactions)
        if isinstance(event, events.ScenarioFinished) and event.status in (
            Status.FAILURE,
            Status.ERROR,
        ):
            for checks in event.recorder.checks.values():
                problems += [
                    f"{event.label}: {c.name}: {c.failure_info.failure.message}"
                    for c in checks
                    if c.failure_info is not None
                ]
        elif isinstance(event, events.NonFatalError):
            problems.append(f"{event.label}: {event.value!r}")
    assert not problems, "\n\n".join(problems)
    assert requests > 100, requests
