"""One chat completion through the admission gateway against the same request straight
to the endpoint.

Subject: ``POST /v1/chat/completions`` with an agent's credential to ``slotrunner
gateway`` (a child process): the credential looked up in Redis, a lease acquired from
the eval-run's desk (one Lua script), the request forwarded to the endpoint, the
answer applied at the desk and the lease released (two more), the body passed on.

Baseline: the same body, by the same ``httpx`` client (keep-alive), straight to the
same endpoint: ``slotrunner fake-endpoint`` in a child process, with a constant
service time (median and p99 equal), so the arms differ by the gateway alone.

Figures: p50 and p99 per call, each as subject over baseline (a model's own latency
is seconds; the fake's 20 ms is a fast model, so the ratio is an upper bound of what
an agent would notice).

Floor: the same request through a proxy that does nothing else (``bench.noop_proxy``:
the raw body forwarded by a kept-alive async httpx client, on the same web stack): the
least any gateway in front of the endpoint costs here.

The three arms are called in turn, one call of each at a time
(``bench.stats.alternate_reps``), so every call of one arm sits beside one of each
other arm in the same second.

Goal: at most 1.2x the direct call, at p50 and at p99 (measured, not asserted).
"""

from __future__ import annotations

import contextlib
import statistics

import httpx
import redis

from bench.fixtures import Context, child_env, noop_server, settings_for
from bench.stats import (
    BenchResult,
    Figure,
    Floor,
    Goal,
    Run,
    alternate_reps,
    percentile,
    summarize,
    timed,
)
from ops.testing.stack import Child, free_port, slotrunner_argv, wait_http
from runner.gateway import mint_credential

GOAL = Goal("<=", 1.2, "<= 1.2x the same request straight to the endpoint")
SERVICE_MS = 20.0
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "benchmark"}]}


def _ratios(subject: list[Run], baseline: list[Run], q: float) -> tuple[float, float, float]:
    """The pooled q-th percentile ratio, and its spread over the repetition pairs."""
    pooled = percentile([d for r in subject for d in r.op_s], q) / percentile(
        [d for r in baseline for d in r.op_s], q
    )
    pairs = [
        percentile(s.op_s, q) / percentile(b.op_s, q)
        for s, b in zip(subject, baseline, strict=True)
    ]
    return pooled, min(pairs), max(pairs)


def run(ctx: Context) -> BenchResult:
    result = BenchResult("gateway")
    reps, n = ctx.pick(3, 7), ctx.pick(40, 300)
    work = ctx.dir("gateway")
    settings = settings_for(work / "home", ctx.redis_url, name="gateway")
    with contextlib.ExitStack() as stack:
        endpoint_port, gateway_port = free_port(), free_port()
        service = str(SERVICE_MS)
        endpoint = Child(
            "fake-endpoint",
            slotrunner_argv(
                *("fake-endpoint", "--port", str(endpoint_port)),
                *("--service-ms-median", service, "--service-ms-p99", service),
            ),
            child_env(settings),
            work / "fake-endpoint.out",
        )
        stack.callback(endpoint.stop)
        gateway = Child(
            "gateway",
            slotrunner_argv("gateway", "--port", str(gateway_port)),
            child_env(settings),
            work / "gateway.out",
        )
        stack.callback(gateway.stop)
        wait_http(endpoint, f"http://127.0.0.1:{endpoint_port}/healthz", 30)
        wait_http(gateway, f"http://127.0.0.1:{gateway_port}/healthz", 30)
        proxy_url, proxy = noop_server(
            work, "bench.noop_proxy", "--upstream", f"http://127.0.0.1:{endpoint_port}"
        )
        stack.callback(proxy.stop)
        client = redis.Redis.from_url(ctx.redis_url, decode_responses=True)
        stack.callback(client.close)
        credential = mint_credential(
            client,
            gateway_url=f"http://127.0.0.1:{gateway_port}/v1",
            ttl_s=3600,
            eval_run="bench-gateway",
            job_id="bench-gateway",
            attempt=1,
            upstream=f"http://127.0.0.1:{endpoint_port}/v1",
            bound=8,
        )
        http = httpx.Client(timeout=30, transport=httpx.HTTPTransport(retries=0))
        stack.callback(http.close)
        auth = {"authorization": f"Bearer {credential.secret}"}
        direct_url = f"http://127.0.0.1:{endpoint_port}/v1/chat/completions"
        gateway_url = f"{credential.gateway_url}/chat/completions"

        def call(url: str, headers: dict[str, str] | None = None) -> None:
            reply = http.post(url, json=BODY, headers=headers)
            if reply.status_code != 200 or not reply.json()["choices"]:
                raise RuntimeError(f"{url} answered {reply.status_code}: {reply.text[:200]}")

        floor_url = f"{proxy_url}/v1/chat/completions"
        # Warm all: connections, the desk and its scripts, the witness file.
        timed(10, lambda _: call(gateway_url, auth))
        timed(10, lambda _: call(direct_url))
        timed(10, lambda _: call(floor_url))

        # Call by call (A B C, C B A, ...), not block by block: a p99 of a few hundred
        # calls is decided by a handful of slow ones, and a block of one arm can meet a
        # slow second of the host that its pair's block never sees.
        runs = alternate_reps(
            reps,
            n,
            {
                "subject": lambda _: call(gateway_url, auth),
                "baseline": lambda _: call(direct_url),
                "floor": lambda _: call(floor_url),
            },
        )
        for q in (50, 99):
            ratio, low, high = _ratios(runs["subject"], runs["baseline"], q)
            at_floor, f_low, f_high = _ratios(runs["subject"], runs["floor"], q)
            floor = Floor(
                name="gateway.floor_proxy",
                what=f"p{q} through a proxy that only forwards (bench.noop_proxy)",
                value=_ratios(runs["floor"], runs["baseline"], q)[0],
                ratio=at_floor,
                ratio_means=f"gateway p{q} per call / bare proxy p{q} per call",
                spread=(f_low, f_high),
            )
            result.figures.append(
                Figure(
                    name=f"gateway.p{q}",
                    what=f"one chat completion, p{q}: through the gateway vs straight",
                    subject_label="POST via slotrunner gateway (credential, lease, apply, release)",
                    baseline_label=f"POST straight to the fake endpoint ({SERVICE_MS:g} ms)",
                    unit="calls/s",
                    subject=summarize(runs["subject"]),
                    baseline=summarize(runs["baseline"]),
                    ratio=ratio,
                    ratio_means=f"gateway p{q} per call / direct p{q} per call",
                    spread=(low, high),
                    goal=GOAL,
                    floor=floor,
                )
            )
        added = statistics.median(
            percentile(s.op_s, 50) - percentile(b.op_s, 50)
            for s, b in zip(runs["subject"], runs["baseline"], strict=True)
        )
        result.notes.append(
            f"{reps} repetitions of {n} calls per arm, the arms called in turn (one call of "
            f"each at a time); one client, one call at a time; the gateway adds "
            f"{added * 1e3:.2f} ms at p50 (median over repetitions); "
            f"a bare proxy hop (the floor) p50 {summarize(runs['floor'])['p50_ms']:.2f} ms, "
            f"p99 {summarize(runs['floor'])['p99_ms']:.2f} ms."
        )
    return result
