"""Log event names and field names: the contract between writers and ``ops.detect.detector``.

Writers (``runner.slots.pool``, ``tools.server.app``) and readers (``ops.detect.detector``,
``ops.detect.verify``) import these constants; neither side types the strings again.
"""

from __future__ import annotations

from typing import Final

SLOT_LEASED: Final = "slot_leased"
SLOT_RELEASED: Final = "slot_released"
SLOT_RELEASE_REFUSED: Final = "slot_release_refused"
SLOT_POISONED: Final = "slot_poisoned"
SLOT_RECLAIMED: Final = "slot_reclaimed"
TOOL_RESULT: Final = "tool_result"
JOB_STARTED: Final = "job_started"
JOB_FINISHED: Final = "job_finished"
# the committed result could not be kept on the host (runner.jobs.result_copy): job_id,
# attempt, error
JOB_RESULT_NOT_KEPT: Final = "job_result_not_kept"
RECEIPT_RESOLVED: Final = "receipt_resolved"
# a lease moved the slot's settled receipts into its archive (runner.slots.rotation):
# slot_id, generation (the new lease's), keys; or could not: slot_id, error
RECEIPTS_ROTATED: Final = "receipts_rotated"
RECEIPTS_ROTATION_FAILED: Final = "receipts_rotation_failed"

# tool_result.outcome values
OUTCOME_APPLIED: Final = "applied"
OUTCOME_REPLAYED: Final = "replayed"
OUTCOME_READ: Final = "read"
OUTCOME_REFUSED: Final = "refused"
OUTCOME_FAILED: Final = "failed"

# fields every line carries, and the fields of each event the detector relies on
COMMON_FIELDS: Final = ("ts", "event", "host")
LEASE_FIELDS: Final = ("slot_id", "generation", "job_id", "attempt")
TOOL_RESULT_FIELDS: Final = (
    "job_id",
    "attempt",
    "slot_id",
    "slot_generation",
    "tool",
    "idempotency_key",
    "outcome",
    "http_status",
    "queue_wait_ms",
    "service_ms",
)
TOOL_RESULT_OPTIONAL_FIELDS: Final = ("reason", "receipt_job", "receipt_generation")
