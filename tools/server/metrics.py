"""Prometheus metrics of one tool server (its own registry, so tests can build many)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ToolMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "slotrunner_tool_calls",
            "Tool calls by tool and outcome",
            ["tool", "outcome"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "slotrunner_refusals",
            "Refused tool calls by reason",
            ["reason"],
            registry=self.registry,
        )
        self.retries = Counter(
            "slotrunner_client_retries",
            "Client retries by decision",
            ["decision"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "slotrunner_executions_in_flight", "Tool executions running now", registry=self.registry
        )
        self.receipt_write_s = Histogram(
            "slotrunner_receipt_write_seconds",
            "Latency of one durable receipt record (append + fsync)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.service_s = Histogram(
            "slotrunner_tool_service_seconds",
            "Time spent applying a call",
            ["tool"],
            registry=self.registry,
        )
