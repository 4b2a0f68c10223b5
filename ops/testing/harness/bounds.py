"""Distribution-free confidence bounds on a quantile, from order statistics; pure.

Why the knee needs them (docs/architecture.md §Testing tools): the p99 of 60 samples
is the single largest value, and the largest of 60 draws of the same lognormal is
twice the largest of another 60 often enough that comparing two such p99s moved the
knee on noise. A quantile counts only as far as its samples bound it.

How: the number of samples at or below the true ``q``-quantile is Binomial(n, q), so
the ``k``-th smallest sample lies at or below it with probability P(B >= k). The
lower bound is the highest rank still below the quantile with ``confidence``, the
upper bound the lowest rank above it. Too few samples give no bound: a 95 % upper
bound on a p99 needs 299 samples (and is then their largest value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # each bound holds with this probability, one-sided


@dataclass(frozen=True)
class Interval:
    """Bounds on one quantile; ``None`` where the samples are too few to bound it."""

    low: float | None
    high: float | None


def min_samples_for_upper(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose largest value bounds the ``q``-quantile from above."""
    return math.ceil(math.log(1 - confidence) / math.log(q))


def _ranks(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks of the lower and upper bound among ``n`` sorted samples.

    One pass down from rank ``n``, summing the binomial tail P(B >= k) in log space
    (so large ``n`` neither overflows nor underflows) until it reaches ``confidence``.
    """
    alpha = 1 - confidence
    log_q, log_p = math.log(q), math.log1p(-q)
    lgn = math.lgamma(n + 1)
    tail, upper = 0.0, None
    for k in range(n, 0, -1):
        tail += math.exp(
            lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q + (n - k) * log_p
        )
        if tail <= alpha:
            upper = k  # P(x_(k) >= quantile) = 1 - P(B >= k) >= confidence
        if tail >= confidence:
            return k, upper  # P(x_(k) <= quantile) = P(B >= k) >= confidence
    return None, upper


def quantile_bounds(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> Interval:
    """Lower and upper ``confidence`` bounds on the ``q``-quantile (``q`` in (0, 1))."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be within (0, 1), not {q}")
    if not values:
        return Interval(None, None)
    ordered = sorted(values)
    low, high = _ranks(len(ordered), q, confidence)
    return Interval(
        None if low is None else ordered[low - 1],
        None if high is None else ordered[high - 1],
    )
