"""Put a job's snapshot back: into its slot, or into any empty directory.

Rollback after a cross-job write is a restore of the victim's own snapshot, never a
reverse-apply of the intruder's diff: the victim may have edited the same path after
the replay (docs/architecture.md §Problem). Receipts and logs are never touched; they are the
audit trail of what happened.

Overwriting a slot that another live job holds would itself be a cross-job write, so
it is refused unless the pool is stopped (no worker consumes the queue) and the
operator says ``--force``.

The job's slot is the last one the event log leased it; a log rotated away names none,
so then it is the slot whose receipts, rotated or hot, name the job last
(:func:`ops.detect.receipts_audit.last_slot_of`, docs/architecture.md §Snapshots).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ops.detect.receipts_audit import last_slot_of
from ops.errors import OpsError
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import read_stamp, utc_now
from runner.workspace.workspaces import Workspaces

DEFAULT_QUEUE = "slotrunner"


class RestoreError(OpsError):
    """The restore cannot (or must not) be done; the message says why."""


@dataclass(frozen=True)
class Restored:
    job_id: str
    which: str
    target: str
    tree: str
    commit: str
    slot_id: str | None


def consuming_workers(
    broker_url: str, queue: str = DEFAULT_QUEUE, timeout_s: float = 1.0
) -> list[str]:
    """Workers that still consume ``queue`` (empty: the pool is stopped)."""
    import celery

    app = celery.Celery(broker=broker_url, set_as_current=False)
    try:
        queues = app.control.inspect(timeout=timeout_s).active_queues() or {}
    finally:
        app.close()
    return sorted(name for name, qs in queues.items() if any(q.get("name") == queue for q in qs))


def job_slot(settings: Settings, job_id: str) -> str | None:
    """The slot a job last held on this host, read from the event log."""
    import json

    from runner.core import events

    found = None
    try:
        with open(settings.log_path, "rb") as handle:
            for line in handle:
                if events.SLOT_LEASED.encode() not in line or job_id.encode() not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") == events.SLOT_LEASED and record.get("job_id") == job_id:
                    found = record.get("slot_id")
    except FileNotFoundError:
        return None
    return found if isinstance(found, str) else None


def restore(
    settings: Settings,
    job_id: str,
    *,
    which: str = "start",
    to: Path | None = None,
    force: bool = False,
    broker_url: str | None = None,
) -> Restored:
    workspaces = Workspaces(settings.home)
    snapshot = workspaces.find_snapshot(job_id, which)
    if snapshot is None:
        raise RestoreError(f"no {which!r} snapshot for job {job_id!r} under {settings.repos_dir}")
    _, commit, _ = snapshot
    if to is not None:
        tree = workspaces.restore(job_id, which, to)
        return Restored(job_id, which, str(to), tree, commit, None)
    slot_id = job_slot(settings, job_id)
    if slot_id is None:
        slot_id, unreadable = last_slot_of(settings.slots_dir, job_id)
        if slot_id is None:
            skipped = f" (unreadable, skipped: {', '.join(unreadable)})" if unreadable else ""
            raise RestoreError(
                f"job {job_id!r} never leased a slot on this host: neither {settings.log_path} "
                f"nor the receipts under {settings.slots_dir} name it{skipped}; use --to DIR"
            )
    slot_dir = settings.slots_dir / slot_id
    with slot_lock(slot_dir):
        stamp = read_stamp(slot_dir)
        held = (
            stamp is not None
            and stamp.job_id not in (None, job_id)
            and stamp.holds_lease()
            and not stamp.is_expired(utc_now())
        )
        if held:
            assert stamp is not None
            holder = f"{stamp.job_id} (generation {stamp.generation})"
            if not force:
                raise RestoreError(
                    f"slot {slot_id} is leased to live job {holder}: restoring into it would "
                    "overwrite that job's tree. Stop the pool (slotrunner ops detect "
                    "--stop-pool, or celery control cancel_consumer slotrunner) and pass "
                    "--force, or use --to DIR"
                )
            still = consuming_workers(broker_url or "", DEFAULT_QUEUE) if broker_url else []
            if still:
                raise RestoreError(
                    f"slot {slot_id} is leased to live job {holder} and the pool is not stopped "
                    f"(still consuming: {', '.join(still)}); --force needs a stopped pool"
                )
        tree = workspaces.restore(job_id, which, slot_dir / "work")
    return Restored(job_id, which, str(slot_dir / "work"), tree, commit, slot_id)
