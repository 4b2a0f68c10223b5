"""Every receipt a slot holds, rotated or hot, as the wire shows them: what a test
reads to check which calls a slot applied (tools/receipts/archive.py keeps a leased
slot's earlier generations out of ``receipts.jsonl``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.receipts.store import RECEIPTS_FILE, ReceiptStore


def slot_receipts(slot_dir: Path) -> list[dict[str, Any]]:
    """The slot's records, the archive's first, then the hot file's, in written order."""
    if not (slot_dir / RECEIPTS_FILE).exists():
        return []
    store = ReceiptStore(slot_dir)
    try:
        return [receipt.to_wire() for receipt in store.records()]
    finally:
        store.close()
