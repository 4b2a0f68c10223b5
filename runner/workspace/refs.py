"""Snapshot ref names, ``refs/slotrunner/snapshots/<job_id>/<which>``, and who may have one.

``<which>`` is one of ``SNAPSHOT_KINDS``; a job id is refused before any git call when
it could not name such a ref, or could name another job's.
"""

from __future__ import annotations

from git import Git

from runner.workspace.git import WorkspaceError

SNAPSHOT_REFS = "refs/slotrunner/snapshots"
SNAPSHOT_KINDS = ("start", "end")
_JOB_ID_MAX_CHARS = 200


def snapshot_ref(job_id: str, which: str) -> str:
    return f"{SNAPSHOT_REFS}/{job_id}/{which}"


def check_job_id(job_id: str) -> None:
    """Refuse a job id that cannot name ``refs/slotrunner/snapshots/<job_id>/...``."""
    problem = None
    if not isinstance(job_id, str) or not job_id:
        problem = "it is empty"
    elif len(job_id) > _JOB_ID_MAX_CHARS:
        problem = f"it is longer than {_JOB_ID_MAX_CHARS} characters"
    elif "/" in job_id:
        # job "a" owns refs .../a/start, so job "a/start" could never get its refs
        problem = "it contains '/'"
    elif any(ord(c) < 32 or ord(c) == 127 for c in job_id):
        problem = "it contains a control character"
    else:
        status, _, _ = Git().execute(
            [
                Git.GIT_PYTHON_GIT_EXECUTABLE or "git",
                "check-ref-format",
                snapshot_ref(job_id, "start"),
            ],
            with_extended_output=True,
            with_exceptions=False,
        )
        if status != 0:
            problem = "git refuses it in a ref name (no spaces, '..', '~^:?*[\\', '@{', .lock)"
    if problem:
        raise WorkspaceError(f"job id {job_id!r} cannot be used: {problem}")


def check_which(which: str) -> None:
    if which not in SNAPSHOT_KINDS:
        raise WorkspaceError(f"snapshot {which!r}: expected one of {', '.join(SNAPSHOT_KINDS)}")
