"""The one way into the tool service, for both doors: the HTTP API and MCP.

``POST /v1/tools/{tool}`` (``tools.server.app``) and an MCP ``tools/call``
(``tools.server.mcp``) each turn their request into ``(tool, {envelope, args})`` and
hand it to :meth:`Dispatcher.call`: the saturation gate, the service's checks and
effect in a worker thread (envelope under the slot lock, tools, key, path, receipts;
``tools.server.service``), then :meth:`Dispatcher.finish`, which writes the call's one
``tool_result`` line and counts it. A door only shapes the reply; no check lives in a
door, so the two cannot drift apart (``docs/architecture.md`` §Tool call).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fastapi.concurrency import run_in_threadpool

from runner.core import events
from runner.core.logs import EventLog
from tools.reasons import Reason
from tools.server.metrics import ToolMetrics
from tools.server.reply import Reply, refused
from tools.server.service import ToolService

_log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self, service: ToolService, metrics: ToolMetrics, log: EventLog, max_concurrent: int
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.log = log
        self.gate = threading.BoundedSemaphore(max_concurrent)

    async def call(self, tool: str, payload: Any, started: float) -> Reply:
        """Run one call through the service; its reply, already logged and counted."""
        if not self.gate.acquire(blocking=False):
            saturated = refused(429, Reason.SATURATED, "the tool server is saturated; retry later")
            return self.finish(tool, saturated, started)
        self.metrics.in_flight.inc()
        try:
            reply = await run_in_threadpool(self.service.call, tool, payload)
        except Exception as exc:
            # A bug, not an input: the caller still gets a classified answer and the call
            # its log line; the traceback goes to stderr for whoever fixes it.
            _log.exception("%s failed inside the tool server", tool)
            reply = Reply(
                500,
                {
                    "error": Reason.OUTCOME_UNKNOWN.value,
                    "message": f"the call failed inside the server ({type(exc).__name__}); "
                    "its outcome is unknown: look its key up before sending it again",
                },
                events.OUTCOME_FAILED,
                Reason.OUTCOME_UNKNOWN.value,
            )
        finally:
            self.metrics.in_flight.dec()
            self.gate.release()
        self.metrics.service_s.labels(tool).observe(time.monotonic() - started)
        return self.finish(tool, reply, started)

    def finish(self, tool: str, reply: Reply, started: float) -> Reply:
        """Write the call's log line and count it; the door sends the reply after this.

        The line goes out before the reply: the detector must never miss an apply
        whose caller already saw success.
        """
        fields = dict(reply.log)
        fields.setdefault("tool", tool)
        fields.setdefault("queue_wait_ms", 0.0)
        fields.setdefault("service_ms", round((time.monotonic() - started) * 1000.0, 2))
        if reply.reason:
            fields["reason"] = reply.reason
        self.log.emit(
            events.TOOL_RESULT, outcome=reply.outcome, http_status=reply.http_status, **fields
        )
        self.metrics.calls.labels(tool, reply.outcome).inc()
        if reply.outcome == events.OUTCOME_REFUSED and reply.reason:
            self.metrics.refusals.labels(reply.reason).inc()
        return reply
