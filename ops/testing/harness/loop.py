"""The load harness: drive an OpenAI-compatible endpoint and split every clock.

Why the clocks are split: docs/architecture.md §Testing tools.

Closed loop (the default): ``C`` worker threads, each with one connection, each sending
its next prompt only when its last one is finished; a prompt is *due* the moment a
worker takes it, so the queue wait is ~0 by construction and any latency belongs to
the endpoint. Open loop: prompts are *due* on a fixed schedule of ``rate_rps`` and wait
in the harness for a free worker; when the endpoint cannot keep up that wait is the
phantom latency a naive harness publishes, and the run is judged invalid.

Retries (429 honouring ``Retry-After``, 5xx, timeouts, lost connections, bodies that
are not completions) are made by the worker that holds the prompt, so retries are part
of the load and never raise it above ``C``. A retry is due when its backoff ends.
"""

from __future__ import annotations

import gc
import os
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from ops.errors import OpsError
from ops.testing.harness.bounds import CONFIDENCE
from ops.testing.harness.stats import (
    MAX_QUEUE_SHARE,
    MIN_GAIN,
    RETRYABLE,
    SERVICE_INFLATION,
    TAIL_Q,
    TIMEOUT_MARGIN,
    Attempt,
    Knee,
    Outcome,
    Point,
    Verdict,
    find_knee,
    judge,
    point_json,
    summarize,
)
from runner.agent import openai_wire as wire

SERVICE_HEADER = "x-service-time-ms"
BACKOFF_BASE_S = 0.1
Clock = Callable[[], float]
OnDone = Callable[[], None]


class HarnessError(OpsError):
    """The sweep cannot run: bad settings, or an endpoint that refuses to be measured."""


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the chat-completions URL (see chat_url)
    prompts: int
    mode: Literal["closed", "open"] = "closed"
    rate_rps: float | None = None  # open loop only
    timeout_s: float = 30.0  # per attempt
    max_attempts: int = 3
    max_backoff_s: float = 10.0  # also caps a Retry-After
    model: str = "fake-model"
    seed: int = 0
    api_key: str | None = field(default=None, repr=False)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise HarnessError("prompts must be at least 1")
        if self.max_attempts < 1:
            raise HarnessError("attempts must be at least 1")
        if self.timeout_s <= 0:
            raise HarnessError("timeout_s must be positive")
        if self.mode == "open" and not (self.rate_rps and self.rate_rps > 0):
            raise HarnessError("open loop needs a positive rate (--rate)")
        if self.mode == "closed" and self.rate_rps is not None:
            raise HarnessError("a rate (--rate) only applies to the open loop (--open-loop)")


def chat_url(url: str) -> str:
    """``http://host:port``, ``.../v1`` or the full ``.../v1/chat/completions``: the last."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise HarnessError(f"--url {url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise HarnessError(f"--url must be an http(s) URL with a host, not {url!r}")
    path = parsed.path.rstrip("/")
    if path.endswith(wire.ROUTE):
        return str(parsed.copy_with(path=path))
    if not path.endswith("/v1"):
        path += "/v1"
    return str(parsed.copy_with(path=path + wire.ROUTE))


def retry_delay_s(
    outcome: Outcome, attempt: int, retry_after: str | None, rng: random.Random, max_s: float
) -> float:
    """How long to wait before attempt ``attempt + 1``: the endpoint's Retry-After when it
    gave one (plus up to 10 % jitter, so a rejected wave does not return as one wave),
    else capped exponential backoff with full jitter."""
    if outcome is Outcome.HTTP_429 and retry_after is not None:
        try:
            given = float(retry_after)
        except ValueError:
            given = -1.0  # an HTTP date or garbage: fall back to backoff
        if given >= 0:
            return min(max_s, given * (1 + 0.1 * rng.random()))
    return min(max_s, BACKOFF_BASE_S * 2.0 ** (attempt - 1)) * (0.5 + 0.5 * rng.random())


def classify(status: int, body: bytes) -> tuple[Outcome, str | None]:
    """The outcome of one HTTP answer, and the completion id when it is a completion."""
    if status == 429:
        return Outcome.HTTP_429, None
    if status >= 500:
        return Outcome.HTTP_5XX, None
    if status != 200:
        return Outcome.HTTP_4XX, None
    try:
        return Outcome.OK, wire.parse_completion(body).id
    except ValueError:
        return Outcome.PROTOCOL_ERROR, None


def _service_ms(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class _Run:
    """One point: the workers, their clocks, the attempts they recorded."""

    def __init__(
        self, config: LoadConfig, concurrency: int, clock: Clock, on_done: OnDone | None
    ) -> None:
        self.config, self.concurrency, self.clock = config, concurrency, clock
        self.on_done = on_done
        self.work: queue.SimpleQueue[tuple[int, float | None] | None] = queue.SimpleQueue()
        self.attempts: list[Attempt] = []
        self.lock = threading.Lock()
        self.headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    def body(self, prompt: int) -> dict[str, Any]:
        # The run id keeps prompts of different runs distinct: the same body again is a retry.
        tag = f"{self.config.run_id}-{self.config.mode}-c{self.concurrency}"
        text = f"[{tag}] prompt {prompt}: answer in one word."
        return wire.chat_request(self.config.model, [wire.user_message(text)], temperature=0)

    def schedule(self, start: float) -> None:
        """Open loop: each prompt becomes due at its slot of the fixed-rate schedule."""
        assert self.config.rate_rps
        for prompt in range(self.config.prompts):
            due = start + prompt / self.config.rate_rps
            time.sleep(max(0.0, due - self.clock()))
            self.work.put((prompt, due))
        for _ in range(self.concurrency):
            self.work.put(None)

    def worker(self, index: int, client: httpx.Client, ready: threading.Barrier) -> None:
        rng = random.Random(f"{self.config.seed}/{self.concurrency}/{index}")
        ready.wait()
        # Closed loop: a prompt is due the moment this worker became free, so the
        # harness's own work between two requests (bookkeeping, progress, waiting for
        # the CPU) is charged to queue_wait, not hidden in the endpoint's latency.
        free_at = self.clock()
        while (item := self.work.get()) is not None:
            prompt, due = item
            free_at = self.drive(client, prompt, free_at if due is None else due, rng)
            if self.on_done is not None:
                self.on_done()

    def drive(self, client: httpx.Client, prompt: int, due: float, rng: random.Random) -> float:
        """Every attempt at one prompt; returns when the last one finished."""
        body = self.body(prompt)
        for n in range(1, self.config.max_attempts + 1):
            status, service, retry_after, completion_id = None, None, None, None
            sent = self.clock()
            try:
                response = client.post(self.config.url, json=body)
                done = self.clock()
            except httpx.TimeoutException:
                done, outcome = self.clock(), Outcome.TIMEOUT
            except httpx.TransportError:
                done, outcome = self.clock(), Outcome.CONNECTION_ERROR
            else:
                status = response.status_code
                outcome, completion_id = classify(status, response.content)
                service = _service_ms(response.headers.get(SERVICE_HEADER))
                retry_after = response.headers.get("retry-after")
            record = Attempt(prompt, n, outcome, status, (sent - due) * 1000,
                             (done - due) * 1000, service, completion_id)  # fmt: skip
            with self.lock:
                self.attempts.append(record)
            if outcome not in RETRYABLE or n == self.config.max_attempts:
                return done
            delay_s = retry_delay_s(outcome, n, retry_after, rng, self.config.max_backoff_s)
            # The retry is due when its backoff ends; oversleeping is the harness's delay.
            due = self.clock() + delay_s
            time.sleep(delay_s)
        raise AssertionError("unreachable: the last attempt returns")

    def run(self) -> Point:
        # Clients are built before the clock starts: building one is CPU work (a TLS
        # context) that would otherwise land in the queue wait of the first requests.
        tls = httpx.create_ssl_context()
        timeout = httpx.Timeout(self.config.timeout_s)
        clients = [httpx.Client(timeout=timeout, headers=self.headers, verify=tls)
                   for _ in range(self.concurrency)]  # fmt: skip
        ready = threading.Barrier(self.concurrency + 1)
        threads = [threading.Thread(target=self.worker, args=(i, client, ready), daemon=True,
                                    name=f"harness-c{self.concurrency}-{i}")
                   for i, client in enumerate(clients)]  # fmt: skip
        if self.config.mode == "closed":
            for prompt in range(self.config.prompts):
                self.work.put((prompt, None))
            for _ in range(self.concurrency):
                self.work.put(None)
        try:
            for thread in threads:
                thread.start()
            ready.wait()
            start = self.clock()
            if self.config.mode == "open":
                scheduler = threading.Thread(target=self.schedule, args=(start,), daemon=True)
                scheduler.start()
                threads.append(scheduler)
            for thread in threads:
                thread.join()
            elapsed_s = self.clock() - start
        finally:
            for client in clients:
                client.close()
        return summarize(
            self.attempts,
            mode=self.config.mode,
            concurrency=self.concurrency,
            prompts=self.config.prompts,
            elapsed_s=elapsed_s,
            rate_rps=self.config.rate_rps,
        )


def run_point(
    config: LoadConfig,
    concurrency: int,
    on_done: OnDone | None = None,
    clock: Clock = time.perf_counter,
) -> Point:
    """Send every prompt at ``concurrency`` and measure it."""
    if concurrency < 1:
        raise HarnessError("concurrency must be at least 1")
    # A full collection of everything the process holds can pause every thread for
    # milliseconds, which lands in some request's queue wait: collect now and freeze
    # the survivors, so collections during the run only scan what the run allocates.
    gc.collect()
    gc.freeze()
    try:
        return _Run(config, concurrency, clock, on_done).run()
    finally:
        gc.unfreeze()


def preflight(config: LoadConfig) -> None:
    """One request first, so a wrong URL is one clear error instead of a sweep of failures."""
    try:
        response = httpx.post(
            config.url,
            timeout=config.timeout_s,
            headers={"authorization": f"Bearer {config.api_key}"} if config.api_key else {},
            json=wire.chat_request(config.model, [wire.user_message("preflight")]),
        )
    except httpx.TimeoutException:
        return  # a slow endpoint is something to measure, not an error
    except httpx.TransportError as exc:
        raise HarnessError(f"cannot reach {config.url}: {exc}") from None
    if response.status_code in (400, 401, 403, 404, 405):
        detail = response.text.strip().replace("\n", " ")[:200]
        raise HarnessError(f"{config.url} answered {response.status_code}: {detail}")


@dataclass(frozen=True)
class SweepReport:
    config: LoadConfig
    points: tuple[Point, ...]
    knee: Knee
    verdicts: tuple[Verdict, ...]
    max_queue_share: float
    min_gain: float = MIN_GAIN
    service_inflation: float = SERVICE_INFLATION

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "url": c.url,
            "mode": c.mode,
            "prompts": c.prompts,
            "rate_rps": c.rate_rps,
            "timeout_s": c.timeout_s,
            "max_attempts": c.max_attempts,
            "run_id": c.run_id,
            "rule": {
                "max_queue_share": self.max_queue_share,
                "series": "first attempts and retries, never pooled",
                "min_gain": self.min_gain,
                "service_inflation": self.service_inflation,
                "timeout_margin": TIMEOUT_MARGIN,
                "tail_quantile": TAIL_Q,
                "tail_confidence": CONFIDENCE,
            },
            "knee": {
                "concurrency": self.knee.concurrency,
                "reason": self.knee.reason,
                "seen_at": self.knee.seen_at,
                "statistic": self.knee.statistic,
                "detail": self.knee.detail,
                "notes": list(self.knee.notes),
            },
            "points": [point_json(p, v) for p, v in zip(self.points, self.verdicts, strict=True)],
        }


def run_sweep(
    config: LoadConfig,
    concurrencies: Sequence[int],
    *,
    on_point: Callable[[int], None] | None = None,
    on_done: OnDone | None = None,
    min_gain: float = MIN_GAIN,
    service_inflation: float = SERVICE_INFLATION,
    max_queue_share: float = MAX_QUEUE_SHARE,
) -> SweepReport:
    """Run each concurrency in increasing order, then find the knee and judge each run."""
    levels = sorted(set(concurrencies))
    if not levels or levels[0] < 1:
        raise HarnessError("concurrency levels must be positive integers")
    preflight(config)
    points = []
    for level in levels:
        if on_point is not None:
            on_point(level)
        points.append(run_point(config, level, on_done))
    knee = find_knee(points, min_gain, service_inflation)
    verdicts = tuple(judge(p, knee, max_queue_share) for p in points)
    return SweepReport(
        config, tuple(points), knee, verdicts, max_queue_share, min_gain, service_inflation
    )


def api_key_from_env(name: str | None) -> str | None:
    """The key in environment variable ``name`` (never a default: the user names it)."""
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise HarnessError(f"environment variable {name} (--api-key-env) is not set")
    return value
