"""The runner's own writes to a slot, fenced like tool calls (I1).

A tool call is applied under the slot's lock after the envelope check proves the
lease (``hooks.check_apply_envelope``). The runner also writes to a slot outside the
tool server: ``job.json``, the recycle of the work tree to the job's base (``git
checkout`` and ``git clean``), the end snapshot's ref. :func:`fenced` gives those the
same guard: it holds the lock the tool server and the janitor take, and proves under
it that the stamp still names this attempt's lease.

Why the lock must be *held*, not only checked: a worker paused (SIGSTOP) in the
middle of a recycle keeps its ``git clean`` process, stopped, inside the slot. Had
the janitor reclaimed the slot meanwhile and leased it to another job, that process
would resume and delete the new owner's files (chaos seed 16). Held across the
write, the lock keeps the janitor out until the writer finishes or dies, and a
process that dies releases its lock with its descriptors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import Timeout

from runner.core.slot_lock import slot_lock
from runner.core.stamp import Stamp, read_stamp
from runner.slots.pool import SlotError

LOCK_TIMEOUT_S = 60.0  # a tool call holds the slot lock for at most its own run


class LeaseLostError(SlotError):
    """The slot is no longer this attempt's lease: nothing more may touch it."""


@contextmanager
def fenced(
    slot_dir: Path,
    stamp: Stamp,
    job_id: str,
    attempt: int,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> Iterator[Stamp]:
    """Hold ``slot_dir``'s lock while its stamp is still (job, attempt, generation)'s lease."""
    try:
        with slot_lock(slot_dir, timeout_s=lock_timeout_s):
            current = read_stamp(slot_dir)
            if not (
                current is not None
                and current.keeps_owner()
                and current.job_id == job_id
                and current.attempt == attempt
                and current.generation == stamp.generation
            ):
                raise LeaseLostError(
                    f"slot {stamp.slot_id} generation {stamp.generation} is no longer the "
                    f"lease of {job_id} attempt {attempt} (stamp: {current})"
                )
            yield current
    except Timeout as exc:
        raise LeaseLostError(f"slot {stamp.slot_id} stayed locked for {lock_timeout_s:g}s") from exc
