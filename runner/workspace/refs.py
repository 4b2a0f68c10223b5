"""Snapshot ref names, ``refs/slotrunner/snapshots/<job_id>/<which>``, and who may have one.

``<which>`` is one of ``SNAPSHOT_KINDS``; a job id is refused before any git call when
it could not name such a ref, or could name another job's: the job-id rule of
``runner.core.ids`` has no '/' (job "a" owns ``.../a/start``, so job "a/start" could
never get its refs) and nothing git refuses in a ref name.
"""

from __future__ import annotations

from runner.core import ids
from runner.workspace.git import WorkspaceError

SNAPSHOT_REFS = "refs/slotrunner/snapshots"
SNAPSHOT_KINDS = ("start", "end")


def snapshot_ref(job_id: str, which: str) -> str:
    return f"{SNAPSHOT_REFS}/{job_id}/{which}"


def check_job_id(job_id: str) -> None:
    """Refuse a job id that cannot name ``refs/slotrunner/snapshots/<job_id>/...``."""
    if not ids.valid_job_id(job_id):
        raise WorkspaceError(f"job id {job_id!r} cannot be used: expected {ids.JOB_ID_RULE}")


def check_which(which: str) -> None:
    if which not in SNAPSHOT_KINDS:
        raise WorkspaceError(f"snapshot {which!r}: expected one of {', '.join(SNAPSHOT_KINDS)}")
