"""What the tool service answers: an HTTP status, a JSON body, and the log line's fields.

:class:`Reply` is the service's whole output; ``tools.server.app`` writes the log
line from it before sending the body, so the detector never misses an apply whose
caller already saw success.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from runner.core import events
from tools.reasons import Reason
from tools.receipts.store import Receipt


@dataclass(frozen=True)
class Reply:
    http_status: int
    body: dict[str, Any]
    outcome: str
    reason: str | None = None
    log: dict[str, Any] = field(default_factory=dict)


def refused(status: int, reason: Reason, message: str, **log: Any) -> Reply:
    return Reply(
        status,
        {"error": reason.value, "message": message},
        events.OUTCOME_REFUSED,
        reason.value,
        log,
    )


def replayed(receipt: Receipt, log: dict[str, Any]) -> Reply:
    """A key that already has an outcome: its receipt, and nothing applied again (I2)."""
    log.update(receipt_job=receipt.job_id, receipt_generation=receipt.generation)
    result = (
        receipt.result
        if receipt.result is not None
        else ({"error": receipt.detail} if receipt.detail else {})
    )
    return Reply(
        200,
        {"result": result, "receipt": receipt.to_wire(), "replayed": True},
        events.OUTCOME_REPLAYED,
        None,
        log,
    )


def outcome_unknown(intent: Receipt, log: dict[str, Any]) -> Reply:
    """An open intent no tree can settle (``exec``): 409, and nothing is run again."""
    log.update(receipt_job=intent.job_id, receipt_generation=intent.generation)
    return Reply(
        409,
        {
            "error": Reason.OUTCOME_UNKNOWN.value,
            "message": f"{intent.tool} with key {intent.key!r} started at {intent.ts} and its "
            "outcome was never recorded (the tool server stopped during it); it may have "
            "run in part or in whole, and it is never run again",
            "receipt": intent.to_wire(),
        },
        events.OUTCOME_REFUSED,
        Reason.OUTCOME_UNKNOWN.value,
        log,
    )


def describe(exc: ValidationError) -> str:
    """The first few validation errors, one line: ``where: what; ...``."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
