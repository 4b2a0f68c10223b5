"""What a tool service is built with besides its settings: its fence, fsync and hooks.

A normally started server (``slotrunner toolserver``) gets the defaults: the envelope
fence (:func:`envelope_fence`, invariant I1), the real fsync
(``runner.core.durable.os_fsync``) and :class:`CallHooks`, which do nothing. Only a
test process builds one otherwise (``ops.testing.toolserver``: the fence off, a fault
plan's fsync and crash). No switch in the environment or on disk can change them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from runner.core.stamp import Stamp
from tools import builtin
from tools.envelope import Envelope, verdict
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore
from tools.server.effects import run_tool

# The check under the slot lock before a call: None lets it through, a reason refuses
# it (409). Given the slot's stamp, the envelope, whether the tool mutates, the slot's
# receipt store and the service clock's now.
Fence = Callable[[Stamp, Envelope, bool, ReceiptStore, datetime], Reason | None]


def envelope_fence(
    stamp: Stamp, envelope: Envelope, mutating: bool, store: ReceiptStore, now: datetime
) -> Reason | None:
    """The envelope's verdict against the slot's stamp and the key's receipt (I1, I2)."""
    key = envelope.idempotency_key
    bound = store.lookup(key) if key else None
    return verdict(
        stamp,
        job_id=envelope.job_id,
        generation=envelope.generation,
        attempt=envelope.attempt,
        idempotency_key=key,
        mutating=mutating,
        now=now,
        slot_id=envelope.slot_id,
        key_holder=bound.job_id if bound is not None else None,
    )


class CallHooks:
    """Points on a call's path where a test may act; here each does what the call does.

    A test's subclass (``ops.testing.toolserver``) kills the server in
    :meth:`after_effect`: the "executed, then crashed" fault, the effect in the tree
    and its outcome never recorded. Another (``ops.testing.toolserver.NoopEffect``)
    skips the effect itself: the benchmark's floor of a call with nothing to apply.
    """

    def effect(
        self, tool: str, ctx: builtin.Context, args: Any, envelope: Envelope
    ) -> dict[str, Any]:
        """A mutating call's effect, between its intent and its outcome: the tool run."""
        return run_tool(tool, ctx, args, envelope)

    def after_effect(self, tool: str, key: str) -> None:
        """A mutating call's effect ran; its outcome is not yet recorded."""
