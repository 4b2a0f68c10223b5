"""What a load run measured and whether it may be published; pure functions, no I/O.

Every attempt carries two clocks (docs/architecture.md §Testing tools):
``queue_wait_ms``, from the moment the attempt was *due* to the moment the harness
*sent* it (time spent inside the harness), and ``service_ms``, the endpoint's own
clock (``x-service-time-ms``). ``observed_ms`` is due-to-done, what a naive harness
would publish. Successful first attempts and
successful retries are two series and are never pooled into one percentile: pooled
retry latencies are how phantom regressions are born. 429s and timeouts are counted
beside the latency, not hidden from it.

A run is valid only if p99(queue_wait) / p99(observed) < ``MAX_QUEUE_SHARE`` in every
series, it completed something, and its concurrency is at or below the knee
(:func:`find_knee`: errors, then the throughput curve; a latency tail only as far as
its samples bound it, ops/testing/harness/bounds.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ops.testing.harness.bounds import CONFIDENCE, Interval, min_samples_for_upper, quantile_bounds

MAX_QUEUE_SHARE = 0.05  # the harness may own at most 5 % of the p99 it publishes
MIN_GAIN = 0.10  # throughput gaining less than this from one step to the next: the knee
SERVICE_INFLATION = 2.0  # service p99 bounded above this many times the smallest C's
TAIL_Q = 0.99  # the latency quantile the knee weighs, through its bounds
TIMEOUT_MARGIN = 0.01  # a timeout rate this much above the smallest-C rate: the knee


class Outcome(StrEnum):
    OK = "ok"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    HTTP_4XX = "http_4xx"  # other than 429: the request is wrong, a retry cannot help
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    PROTOCOL_ERROR = "protocol_error"  # a 200 whose body is empty or not a chat completion


RETRYABLE = frozenset(Outcome) - {Outcome.OK, Outcome.HTTP_4XX}


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt at one prompt; ``attempt`` 1 is the first, >1 a retry."""

    prompt: int
    attempt: int
    outcome: Outcome
    status: int | None
    queue_wait_ms: float
    observed_ms: float
    service_ms: float | None = None
    completion_id: str | None = None


@dataclass(frozen=True)
class Quantiles:
    count: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Series:
    """One population of successful attempts, all three clocks."""

    count: int
    observed_ms: Quantiles
    service_ms: Quantiles
    queue_wait_ms: Quantiles
    transit_ms: Quantiles  # observed - queue_wait - service: network and both HTTP stacks
    queue_share: float | None  # p99(queue_wait) / p99(observed)
    service_p99_bounds: Interval  # CONFIDENCE bounds on the service p99; None: too few samples


@dataclass(frozen=True)
class Point:
    """One run at one concurrency."""

    mode: Literal["closed", "open"]
    concurrency: int
    rate_rps: float | None
    prompts: int
    elapsed_s: float
    throughput_rps: float  # prompts completed per second (goodput)
    attempts: int
    retries: int
    failed_prompts: int  # every attempt failed
    duplicates_seen: int  # a completion id received twice
    outcomes: dict[str, int]
    rate_429: float
    timeout_rate: float
    limit_rate: float  # (429 + timeouts) / attempts: reported beside every latency
    first: Series
    retry: Series


@dataclass(frozen=True)
class Knee:
    """Where throughput stops paying for concurrency; ``None`` if already past at the smallest.

    ``statistic`` names what decided, ``detail`` gives its numbers, ``notes`` the
    signals seen and not acted on (a tail too thin to weigh, throughput still rising).
    """

    concurrency: int | None
    reason: (
        str  # 429s_appear | timeouts_rise | service_p99_inflated | throughput_flat | not_reached
    )
    seen_at: int | None  # the concurrency that showed the signal
    statistic: str = field(default="", compare=False)  # rate_429 | timeout_rate | ...
    detail: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reasons: tuple[str, ...] = field(default_factory=tuple)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]): always a value that was measured."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], not {q}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def quantiles(values: Sequence[float]) -> Quantiles:
    if not values:
        return Quantiles(0, None, None, None, None)
    return Quantiles(
        len(values),
        percentile(values, 0.50),
        percentile(values, 0.95),
        percentile(values, 0.99),
        max(values),
    )


def series(attempts: Sequence[Attempt]) -> Series:
    observed = quantiles([a.observed_ms for a in attempts])
    queue = quantiles([a.queue_wait_ms for a in attempts])
    service_values = [a.service_ms for a in attempts if a.service_ms is not None]
    service = quantiles(service_values)
    transit = quantiles(
        [
            a.observed_ms - a.queue_wait_ms - a.service_ms
            for a in attempts
            if a.service_ms is not None
        ]
    )
    share = None
    if observed.p99 is not None and queue.p99 is not None:
        share = queue.p99 / observed.p99 if observed.p99 > 0 else 0.0
    bounds = quantile_bounds(service_values, TAIL_Q)
    return Series(len(attempts), observed, service, queue, transit, share, bounds)


def summarize(
    attempts: Sequence[Attempt],
    *,
    mode: Literal["closed", "open"],
    concurrency: int,
    prompts: int,
    elapsed_s: float,
    rate_rps: float | None = None,
) -> Point:
    """The point a run measured, from every attempt it made."""
    ok = [a for a in attempts if a.outcome is Outcome.OK]
    done_prompts = {a.prompt for a in ok}
    outcomes = Counter(a.outcome.value for a in attempts)
    ids = Counter(a.completion_id for a in ok if a.completion_id)
    total = len(attempts)
    n_429, n_timeout = outcomes[Outcome.HTTP_429], outcomes[Outcome.TIMEOUT]
    return Point(
        mode=mode,
        concurrency=concurrency,
        rate_rps=rate_rps,
        prompts=prompts,
        elapsed_s=elapsed_s,
        throughput_rps=len(done_prompts) / elapsed_s if elapsed_s > 0 else 0.0,
        attempts=total,
        retries=sum(1 for a in attempts if a.attempt > 1),
        failed_prompts=prompts - len(done_prompts),
        duplicates_seen=sum(n - 1 for n in ids.values()),
        outcomes={o.value: outcomes[o.value] for o in Outcome},
        rate_429=n_429 / total if total else 0.0,
        timeout_rate=n_timeout / total if total else 0.0,
        limit_rate=(n_429 + n_timeout) / total if total else 0.0,
        first=series([a for a in ok if a.attempt == 1]),
        retry=series([a for a in ok if a.attempt > 1]),
    )


def _tail(point: Point, base: Point, inflation: float) -> tuple[bool, str]:
    """Whether ``point``'s service p99 is ``inflation`` times ``base``'s beyond doubt, and
    the words for it; no words when even the raw p99s do not differ that much.

    Beyond doubt: the lower bound of the p99 at ``point`` exceeds ``inflation`` times the
    upper bound at ``base``. A lone slow sample moves a small run's p99 (with 60
    samples, its largest value) but not these bounds.
    """
    c, b = point.concurrency, base.concurrency
    low, high = point.first.service_p99_bounds.low, base.first.service_p99_bounds.high
    if low is not None and high is not None and low > inflation * high:
        return True, (
            f"service p99 at C={c} is bounded below by {low:.1f} ms, over {inflation:g}x "
            f"the {high:.1f} ms bounding C={b}'s above ({CONFIDENCE:.0%} bounds)"
        )
    p99, base_p99 = point.first.service_ms.p99, base.first.service_ms.p99
    if p99 is None or base_p99 is None or p99 <= base_p99 * inflation:
        return False, ""
    seen = f"service p99 {p99:.1f} ms at C={c} is {p99 / base_p99:.1f}x C={b}'s {base_p99:.1f} ms"
    need = min_samples_for_upper(TAIL_Q)
    if high is None:
        why = (
            f"C={b}'s {base.first.service_ms.count} samples cannot bound a p99 above (needs {need})"
        )
    elif low is None:
        why = f"C={c}'s {point.first.service_ms.count} samples cannot bound a p99 below"
    else:
        why = f"its lower bound {low:.1f} ms is within {inflation:g}x C={b}'s upper {high:.1f} ms"
    return False, f"{seen}, not weighed: {why}"


def find_knee(
    points: Sequence[Point],
    min_gain: float = MIN_GAIN,
    service_inflation: float = SERVICE_INFLATION,
) -> Knee:
    """The last concurrency before the first sign of saturation, in increasing concurrency.

    Errors end the rise wherever they appear: any 429, or a timeout rate
    ``TIMEOUT_MARGIN`` above the smallest C's. Otherwise the throughput curve decides:
    the knee is the level before the first one that gains less than ``min_gain``. The
    latency tail never moves it earlier (docs/architecture.md §Testing tools): where
    throughput stopped gaining it names the reason, and only when :func:`_tail` finds
    the inflation beyond doubt; a tail inflated elsewhere, or too thin to weigh, is a
    note in the knee, not the knee.
    """
    ordered = sorted(points, key=lambda p: p.concurrency)
    if not ordered:
        raise ValueError("no points to find a knee in")
    base, notes = ordered[0], list[str]()
    prev: Point | None = None
    for point in ordered:
        c, before = point.concurrency, (prev.concurrency if prev else None)
        if point.rate_429 > 0:
            said = f"{point.rate_429:.1%} of the attempts at C={c} were answered 429"
            return Knee(before, "429s_appear", c, "rate_429", said, tuple(notes))
        if prev is None:
            prev = point
            continue
        if point.timeout_rate > base.timeout_rate + TIMEOUT_MARGIN:
            said = (f"timeout rate {point.timeout_rate:.1%} at C={c} against "
                    f"{base.timeout_rate:.1%} at C={base.concurrency}")  # fmt: skip
            return Knee(before, "timeouts_rise", c, "timeout_rate", said, tuple(notes))
        gain = point.throughput_rps / prev.throughput_rps - 1 if prev.throughput_rps else 0.0
        rise = (f"throughput {prev.throughput_rps:.1f} -> {point.throughput_rps:.1f} rps "
                f"from C={before} to C={c} ({gain:+.0%}, min gain {min_gain:.0%})")  # fmt: skip
        inflated, tail = _tail(point, base, service_inflation)
        if point.throughput_rps < prev.throughput_rps * (1 + min_gain):
            if inflated:
                statistic = "service_ms.p99 bounds + throughput_rps"
                return Knee(before, "service_p99_inflated", c, statistic, f"{tail}; {rise}",
                            tuple(notes))  # fmt: skip
            if tail:
                notes.append(tail)
            return Knee(before, "throughput_flat", c, "throughput_rps", rise, tuple(notes))
        if tail:
            notes.append(f"{tail}; not the knee: {rise}" if inflated else tail)
        prev = point
    last = ordered[-1]
    said = f"throughput gained at least {min_gain:.0%} at every step up to C={last.concurrency}"
    return Knee(last.concurrency, "not_reached", None, "throughput_rps", said, tuple(notes))


def judge(point: Point, knee: Knee, max_queue_share: float = MAX_QUEUE_SHARE) -> Verdict:
    """Publishable or not, and why not (the run is invalid, not slow)."""
    reasons = []
    if point.first.count == 0:
        reasons.append("no_completed_first_attempts")
    shares = [s.queue_share for s in (point.first, point.retry) if s.queue_share is not None]
    if any(share >= max_queue_share for share in shares):
        reasons.append("queue_wait_share")
    if knee.concurrency is None or point.concurrency > knee.concurrency:
        reasons.append("above_knee")
    return Verdict(not reasons, tuple(reasons))


def point_json(point: Point, verdict: Verdict) -> dict[str, Any]:
    return {**asdict(point), "valid": verdict.valid, "invalid_reasons": list(verdict.reasons)}
