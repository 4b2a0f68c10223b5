"""Every refusal reason of the design, as one named value used everywhere.

The string values are the wire and log contract (DESIGN §5): they appear in 409/403
bodies, in ``tool_result.reason`` log fields, and on the stderr of
``hooks.check_apply_envelope``.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    SLOT_JOB_MISMATCH = "slot_job_mismatch"
    STALE_GENERATION = "stale_generation"
    MISSING_IDEMPOTENCY_KEY = "missing_idempotency_key"
    LEASE_EXPIRED = "lease_expired"
    KEY_BOUND_TO_OTHER_JOB = "key_bound_to_other_job"
    OUTSIDE_WORKSPACE = "outside_workspace"
    SLOT_POISONED = "slot_poisoned"
    UNKNOWN_TOOL = "unknown_tool"
    MALFORMED = "malformed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    SATURATED = "saturated"
    UNAUTHORIZED = "unauthorized"
    TOO_LARGE = "too_large"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"


class ToolError(Exception):
    """Base of the tools package's error tree: a refusal carrying its reason."""

    reason: Reason = Reason.MALFORMED

    def __init__(self, message: str, reason: Reason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.reason.value
