"""The admission gateway for tests: in this process or as ``slotrunner gateway``, with
credentials minted as the job runner mints them, and the official ``openai`` client."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import redis

from ops.testing.stack import Child, free_port, slotrunner_argv, wait_http
from runner.admission.desk import AdmissionDesk
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.gateway.app import create_app
from runner.gateway.credentials import Credential, mint_credential
from runner.gateway.server import GatewayThread
from tests.support.toolserver import child_env


def new_run() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


class Gateway:
    """A gateway serving one test (``stop()`` it): its URL, credentials, counts."""

    def __init__(self, url: str, redis_client: redis.Redis, stop: Callable[[], None]) -> None:
        self.url = url  # the API base, http://127.0.0.1:PORT/v1
        self.root = url.removesuffix("/v1")
        self.redis = redis_client
        self.stop = stop

    @classmethod
    def in_process(cls, settings: Settings, redis_client: redis.Redis, **knobs: Any) -> Gateway:
        server = GatewayThread(create_app(settings, redis_client=redis_client, **knobs)).start()
        return cls(server.url, redis_client, server.stop)

    @classmethod
    def process(
        cls, settings: Settings, redis_client: redis.Redis, log_dir: Path, *args: str
    ) -> Gateway:
        """``slotrunner gateway`` in a child process, ready when ``/healthz`` answers."""
        port = free_port()
        argv = slotrunner_argv("gateway", "--port", str(port), *args)
        child = Child("gateway", argv, child_env(settings), log_dir / "gateway.out")
        wait_http(child, f"http://127.0.0.1:{port}/healthz", 30)
        return cls(f"http://127.0.0.1:{port}/v1", redis_client, child.stop)

    def mint(
        self,
        upstream: str,
        *,
        eval_run: str,
        bound: int,
        job_id: str = "job-1",
        attempt: int = 1,
        ttl_s: float = 120.0,
        **grant: Any,
    ) -> Credential:
        return mint_credential(
            self.redis,
            gateway_url=self.url,
            ttl_s=ttl_s,
            eval_run=eval_run,
            job_id=job_id,
            attempt=attempt,
            upstream=upstream,
            bound=bound,
            **grant,
        )

    def stats(self, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{self.root}/stats", headers=headers).json()
        return found

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = self.stats()["gateway"]["outcomes"]
        return counts

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 20) -> None:
        """Until ``predicate`` holds on the gateway's own counts (``/stats`` "gateway")."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.update(self.stats()["gateway"])
            return predicate(seen)

        try:
            poll_until(holds, timeout_s, interval_s=0.02)
        except PollTimeout:
            raise AssertionError(f"the gateway's counts never got there: {seen}") from None


def client(credential: Credential, **options: Any) -> openai.OpenAI:
    """The official client, as an agent holds it: the gateway's URL and its credential."""
    return openai.OpenAI(
        base_url=credential.gateway_url,
        api_key=credential.secret,
        max_retries=options.pop("max_retries", 0),
        **options,
    )


def desk_stats(redis_client: redis.Redis, eval_run: str, bound: int) -> dict[str, int]:
    """The desk's own counts, read from Redis (an object of the desk touches nothing)."""
    return AdmissionDesk(redis_client, eval_run, bound).stats()


def upstream(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"
