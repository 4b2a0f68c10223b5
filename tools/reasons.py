"""Every refusal reason slotrunner gives, as one named value used everywhere.

The string values are the wire and log contract (docs/architecture.md §Reasons): they
appear in 409/403 bodies, in ``tool_result.reason`` log fields, and on the stderr of
``hooks.check_apply_envelope``. The errors that carry them are in ``tools.errors``.
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
    NOT_FOUND = "not_found"  # a read of a file the tree does not have
    # The tool is not among those the job's lease may call (the spec's ``tools``).
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    # What the worker's client reports beyond the server's own reasons
    # (``tools.client``): a refusal whose body named no reason it knows, and a call
    # that was not sent or not answered and is not retried further.
    REFUSED = "refused"
    TRANSPORT_FAILED = "transport_failed"
