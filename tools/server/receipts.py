"""The tool server's side of the receipt stores: one kept-open store per slot, timed
writes, an open intent resolved from the tree, the receipt lookup and start-up recovery.

An intent with no outcome means the process died (or the reply was lost) between
the two records. It is turned into ``applied`` only when the tree proves the effect
happened (``tools.receipts.resolve.observe``); otherwise it stays open, so a resend
of the same key applies it exactly once (I2, I3). An ``exec`` intent is never judged:
it stays open as outcome unknown, and its key never runs again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from runner.core import events
from runner.core.durable import Fsync, os_fsync
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import valid_slot_id
from tools import builtin
from tools.reasons import Reason
from tools.receipts.resolve import judged, observe
from tools.receipts.store import Receipt, ReceiptDurabilityError, ReceiptStore, Status
from tools.server.reply import Reply, refused

RESOLVED_FROM_TREE = "resolved_from_tree"


class SlotReceipts:
    """The receipt stores of this host's slots, as the tool service uses them."""

    def __init__(
        self,
        settings: Settings,
        *,
        on_write: Callable[[float], None] | None = None,
        emit: Callable[..., None] | None = None,
        fsync: Fsync = os_fsync,
    ) -> None:
        self.settings = settings
        self.on_write = on_write
        self.emit = emit
        self.fsync = fsync
        self._stores: dict[str, ReceiptStore] = {}

    def store(self, slot_id: str) -> ReceiptStore:
        store = self._stores.get(slot_id)
        if store is None:
            slot_dir = self.settings.slots_dir / slot_id
            store = self._stores[slot_id] = ReceiptStore(slot_dir, fsync=self.fsync)
        return store

    def timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one receipt operation, reporting its latency when it wrote a record."""
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        # A begin that found an existing receipt wrote nothing: not an fsync to time.
        if self.on_write is not None and getattr(result, "fresh", True):
            self.on_write(time.perf_counter() - started)
        return result

    def resolve(self, ctx: builtin.Context, store: ReceiptStore, intent: Receipt) -> Receipt:
        """Turn an open intent into an outcome when the tree proves it happened."""
        if not observe(ctx, intent):
            # Not applied: the intent stays open, so a retry with the same key applies
            # it (once); answering "failed" here would burn a key whose effect never ran.
            return intent
        done = self.timed(store.finish, intent, Status.APPLIED, detail=RESOLVED_FROM_TREE)
        if self.emit is not None:
            # The apply happened but its line was never written (the process died
            # before its reply): write it now so the detector's history is whole.
            self.emit(
                job_id=done.job_id,
                attempt=done.attempt,
                slot_id=done.slot_id,
                slot_generation=done.generation,
                tool=done.tool,
                idempotency_key=done.key,
                outcome=events.OUTCOME_APPLIED,
                reason=RESOLVED_FROM_TREE,
                receipt_job=done.job_id,
                receipt_generation=done.generation,
                http_status=0,
                queue_wait_ms=0.0,
                service_ms=0.0,
            )
        return cast(Receipt, done)

    def lookup(self, key: str, slot_id: str) -> Reply:
        """``GET /v1/receipts/{key}?slot=``: the key's outcome, resolving an open intent."""
        slot_dir = self.settings.slots_dir / slot_id
        if not valid_slot_id(slot_id) or not slot_dir.is_dir():
            return refused(404, Reason.MALFORMED, f"no slot {slot_id!r} on this host")
        store = self.store(slot_id)
        with slot_lock(slot_dir):
            receipt = store.lookup(key)
            if receipt is not None and receipt.status == Status.INTENT and not judged(receipt.tool):
                return Reply(
                    409,
                    {
                        "error": Reason.OUTCOME_UNKNOWN.value,
                        "status": "unknown",
                        "key": key,
                        "message": f"{receipt.tool} started and its outcome was never recorded",
                    },
                    events.OUTCOME_READ,
                )
            if receipt is not None and receipt.status == Status.INTENT:
                try:
                    receipt = self.resolve(builtin.Context(slot_dir, self.settings), store, receipt)
                except ReceiptDurabilityError as exc:
                    # The tree may show it, but the outcome cannot be recorded: unknown.
                    return Reply(
                        503,
                        {
                            "error": Reason.OUTCOME_UNKNOWN.value,
                            "status": "unknown",
                            "key": key,
                            "message": exc.message,
                        },
                        events.OUTCOME_READ,
                    )
        if receipt is None or receipt.status == Status.INTENT:
            state = "absent" if receipt is None else "not_applied"
            return Reply(
                404, {"error": "no_receipt", "status": state, "key": key}, events.OUTCOME_READ
            )
        return Reply(200, {"receipt": receipt.to_wire()}, events.OUTCOME_READ)

    def recover(self) -> list[dict[str, Any]]:
        """At start: resolve every intent that has no outcome, in every slot."""
        resolved: list[dict[str, Any]] = []
        if not self.settings.slots_dir.is_dir():
            return resolved
        for slot_dir in sorted(self.settings.slots_dir.iterdir()):
            if not slot_dir.is_dir() or not valid_slot_id(slot_dir.name):
                continue
            store = self.store(slot_dir.name)
            with slot_lock(slot_dir):
                for intent in store.open_intents():
                    after = self.resolve(builtin.Context(slot_dir, self.settings), store, intent)
                    resolved.append(
                        {
                            "slot_id": slot_dir.name,
                            "key": intent.key,
                            "tool": intent.tool,
                            "job_id": intent.job_id,
                            "generation": intent.generation,
                            "resolution": _resolution(after),
                        }
                    )
        return resolved


def _resolution(after: Receipt) -> str:
    if after.status == Status.APPLIED:
        return "applied"
    return "not_applied" if judged(after.tool) else Reason.OUTCOME_UNKNOWN.value
