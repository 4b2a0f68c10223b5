"""A new lease first moves the slot's settled receipts into its archive, so the hot
receipt file holds one generation and no process ever reads a slot's whole history
(``tools/receipts/archive.py``, docs/architecture.md §Receipts).

Called by the pool under the slot's lock, before the new stamp. Rotation is an
economy, never a condition of the lease: a slot with an open intent keeps its hot
file until the janitor settles it, and a rotation the disk refuses is logged and the
lease goes on with the records where they were (each step of a rotation leaves the
receipts whole, whatever point it stops at).
"""

from __future__ import annotations

from pathlib import Path

from runner.core import events
from runner.core.durable import Fsync, os_fsync
from runner.core.logs import EventLog
from tools.errors import ToolError
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore


def rotate_receipts(
    slot_dir: Path, generation: int, log: EventLog, *, fsync: Fsync = os_fsync
) -> int | None:
    """Rotate ``slot_dir``'s receipts ahead of lease ``generation``; the keys moved."""
    if not (slot_dir / RECEIPTS_FILE).exists():
        return None
    store = ReceiptStore(slot_dir, fsync=fsync)
    try:
        moved = store.rotate()
    except (OSError, ToolError) as exc:
        log.emit(
            events.RECEIPTS_ROTATION_FAILED,
            slot_id=slot_dir.name,
            generation=generation,
            error=f"{type(exc).__name__}: {exc}",
        )
        return None
    finally:
        store.close()
    if moved is not None:
        log.emit(events.RECEIPTS_ROTATED, slot_id=slot_dir.name, generation=generation, keys=moved)
    return moved
