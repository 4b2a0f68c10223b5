"""What the admission gateway counts: Prometheus metrics, and the same counts as JSON.

Every request ends with one *outcome* (:data:`OUTCOMES`); refusals are also counted by
the desk's reason, and late bodies that were dropped as stale on their own. The same
numbers are served as Prometheus text on ``/metrics`` and as JSON on ``/stats``
(docs/architecture.md §Gateway). The desk counts its own side (``refused``,
``stale_completion``, ``expired``...) in Redis, across every gateway of the run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

# How one request through the gateway ended.
OUTCOMES = (
    "completed",  # a completion delivered
    "streamed",  # a stream relayed to its end
    "client_gone",  # the caller left mid-stream; the lease was released then
    "stream_broken",  # the upstream broke off mid-stream
    "refused",  # not admitted within its wait: 429 with Retry-After
    "timeout",  # past the local timeout: lease expired, 504, the late body judged later
    "upstream_429",  # the upstream said later: capacity back, 429 passed on
    "upstream_5xx",  # 502
    "upstream_unreachable",  # connection or protocol error talking to the upstream: 502
    "upstream_4xx",  # passed on as it came
    "stale",  # the answer came in time but its lease was no longer live: 502
    "unauthorized",  # no credential, or an unknown one: 401, nothing forwarded
    "superseded",  # a newer attempt of the job exists: 403
    "bad_request",  # not a JSON object: 400
    "misconfigured",  # the grant names an upstream key the gateway does not have: 500
    "desk_error",  # the desk could not be reached or disagrees on the bound: 503/500
)


class GatewayMetrics:
    """The gateway's counters; ``counts`` mirrors them for ``/stats``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counts: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self._requests = PromCounter(
            "slotrunner_gateway_requests",
            "Chat-completion requests through the gateway, by how they ended",
            ["outcome"],
            registry=self.registry,
        )
        self._refused = PromCounter(
            "slotrunner_gateway_admission_refused",
            "Requests the eval-run's desk did not admit, by the desk's reason",
            ["reason"],
            registry=self.registry,
        )
        self._stale = PromCounter(
            "slotrunner_gateway_stale_completions",
            "Late upstream answers to expired leases, dropped and never delivered",
            registry=self.registry,
        )
        self._late_failed = PromCounter(
            "slotrunner_gateway_late_failures",
            "Timed-out requests whose upstream answer never came (error or cut off)",
            registry=self.registry,
        )
        self.held = 0  # leases held now
        self._held = Gauge(
            "slotrunner_gateway_leases_held",
            "Admission leases this gateway holds now (requests at the upstream)",
            registry=self.registry,
        )
        self.admission_wait_s = Histogram(
            "slotrunner_gateway_admission_wait_seconds",
            "Time from arrival to an admission lease",
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self._requests.labels(outcome)

    def outcome(self, name: str) -> None:
        if name not in OUTCOMES:
            raise ValueError(f"unknown gateway outcome {name!r}")
        self.counts[name] += 1
        self._requests.labels(name).inc()

    def refused(self, reason: str) -> None:
        self.refusals[reason] += 1
        self._refused.labels(reason).inc()
        self.outcome("refused")

    def leased(self, change: int) -> None:
        """A lease taken (+1) or given back (-1) by this gateway."""
        self.held += change
        self._held.set(self.held)

    def stale(self) -> None:
        self.counts["stale_completions"] += 1
        self._stale.inc()

    def late_failed(self) -> None:
        self.counts["late_failures"] += 1
        self._late_failed.inc()

    def snapshot(self) -> dict[str, Any]:
        return {
            "outcomes": {name: self.counts[name] for name in OUTCOMES},
            "refused_by_reason": dict(self.refusals),
            "stale_completions": self.counts["stale_completions"],
            "late_failures": self.counts["late_failures"],
            "leases_held": self.held,
        }
