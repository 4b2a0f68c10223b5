"""One tool call, from request body to reply, with no HTTP in sight.

Order of checks (docs/architecture.md §Tool call): the envelope first, under the
slot lock (a stale or foreign envelope is refused even when its key has a receipt),
then the key, then the path, then the effect. For a mutating call the intent is
durable before the effect and the outcome durable before the reply (I3); a key that
already has an outcome is answered from its receipt and never applied again (I2). The
receipts' side (stores, resolution, lookup, recovery) is ``tools.server.receipts``;
the effects themselves are ``tools.server.effects``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from runner.core import events
from runner.core.durable import Fsync, os_fsync
from runner.core.settings import Settings
from runner.core.slot_lock import slot_lock
from runner.core.stamp import SlotState, read_stamp, utc_now, valid_slot_id, write_stamp
from tools import builtin, paths, registry, shell, tokens
from tools.envelope import Envelope
from tools.errors import ToolError
from tools.reasons import Reason
from tools.receipts.resolve import judged
from tools.receipts.store import KeyBoundToOtherJob, ReceiptDurabilityError, ReceiptStore, Status
from tools.sandbox.policy import SandboxUnavailable
from tools.server.effects import intent_fields, run_tool
from tools.server.receipts import SlotReceipts
from tools.server.reply import Reply, describe, outcome_unknown, refused, replayed
from tools.server.seams import CallHooks, Fence, envelope_fence


class ToolService:
    """The calls of one host's slots. ``fence``, ``fsync`` and ``hooks`` are the seams
    of ``tools.server.seams``: a normally built service has the real ones."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], datetime] = utc_now,
        on_receipt_write: Callable[[float], None] | None = None,
        emit: Callable[..., None] | None = None,
        *,
        fence: Fence = envelope_fence,
        fsync: Fsync = os_fsync,
        hooks: CallHooks | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.fence = fence
        self.fsync = fsync
        self.hooks = hooks or CallHooks()
        self.receipts = SlotReceipts(settings, on_write=on_receipt_write, emit=emit, fsync=fsync)

    def lookup(self, key: str, slot_id: str) -> Reply:
        return self.receipts.lookup(key, slot_id)

    def recover(self) -> list[dict[str, Any]]:
        return self.receipts.recover()

    # -- a call ---------------------------------------------------------------

    @staticmethod
    def unknown_tool(tool: str) -> Reply:
        known = ", ".join(sorted(registry.TOOLS))
        return refused(404, Reason.UNKNOWN_TOOL, f"no tool named {tool!r}; known: {known}")

    def call(self, tool: str, payload: Any) -> Reply:
        spec = registry.get(tool)
        if spec is None:
            return self.unknown_tool(tool)
        if not isinstance(payload, dict) or set(payload) - {"envelope", "args"}:
            return refused(422, Reason.MALFORMED, 'the body must be {"envelope": ..., "args": ...}')
        try:
            # Strict: a JSON body's "1" or true is not the integer the envelope names.
            envelope = Envelope.model_validate(payload.get("envelope"), strict=True)
        except ValidationError as exc:
            return refused(422, Reason.MALFORMED, f"bad envelope: {describe(exc)}")
        log = {
            "job_id": envelope.job_id,
            "attempt": envelope.attempt,
            "slot_id": envelope.slot_id,
            "slot_generation": envelope.generation,
            "tool": tool,
            "idempotency_key": envelope.idempotency_key,
        }
        if envelope.tool != tool:
            return refused(
                422,
                Reason.MALFORMED,
                f"envelope names tool {envelope.tool!r} but the URL names {tool!r}",
                **log,
            )
        # Only a missing or null ``args`` means "no arguments": [] or false is malformed.
        raw_args = payload.get("args")
        try:
            args: BaseModel = spec.args_model.model_validate(
                {} if raw_args is None else raw_args, strict=True
            )
        except ValidationError as exc:
            return refused(422, Reason.MALFORMED, f"bad args for {tool}: {describe(exc)}", **log)
        slot_dir = self.settings.slots_dir / envelope.slot_id
        if not valid_slot_id(envelope.slot_id) or not slot_dir.is_dir():
            return refused(
                409, Reason.SLOT_JOB_MISMATCH, f"no slot {envelope.slot_id!r} on this host", **log
            )
        waited = time.monotonic()
        with slot_lock(slot_dir):
            queue_wait_ms = (time.monotonic() - waited) * 1000.0
            log["queue_wait_ms"] = round(queue_wait_ms, 2)
            reply = self._locked_call(spec, envelope, args, slot_dir, log)
        return reply

    def _locked_call(
        self,
        spec: registry.ToolSpec,
        envelope: Envelope,
        args: BaseModel,
        slot_dir: Any,
        log: dict[str, Any],
    ) -> Reply:
        stamp = read_stamp(slot_dir)
        if stamp is None:
            return refused(409, Reason.SLOT_JOB_MISMATCH, "the slot has never been leased", **log)
        store = self.receipts.store(envelope.slot_id)
        if spec.mutating and store.broken is not None:
            # A receipt fsync failed on this slot: nothing more may be applied here, even
            # a resend of a key whose intent is on disk but was never made durable.
            with contextlib.suppress(OSError):
                self._mark_poisoned(slot_dir, f"receipt store failed: {store.broken}")
            return refused(409, Reason.SLOT_POISONED, f"slot poisoned: {store.broken}", **log)
        reason = self.fence(stamp, envelope, spec.mutating, store, self.clock())
        if reason is not None:
            holder = f"{stamp.job_id}@{stamp.generation}"
            return refused(409, reason, f"{reason.value}: the slot is held by {holder}", **log)
        if not _allowed(slot_dir, envelope.generation, spec.name):
            return refused(
                403,
                Reason.TOOL_NOT_ALLOWED,
                f"{spec.name} is not among the tools of this lease (the job spec's tools)",
                **log,
            )
        ctx = builtin.Context(slot_dir, self.settings)
        if not spec.mutating:
            return _read(spec, ctx, args, envelope, log)
        return self._mutate(spec, envelope, args, ctx, store, log)

    def _mutate(
        self,
        spec: registry.ToolSpec,
        envelope: Envelope,
        args: BaseModel,
        ctx: builtin.Context,
        store: ReceiptStore,
        log: dict[str, Any],
    ) -> Reply:
        assert envelope.idempotency_key is not None
        try:
            fields = intent_fields(spec.name, ctx, args)
        except paths.PathRefused as exc:
            return refused(403, Reason.OUTSIDE_WORKSPACE, exc.message, **log)
        except ToolError as exc:
            # Nothing was recorded or changed: a patch naming no file, a path naming a
            # directory where the tool needs a file (a directory is not a file).
            return refused(422, Reason.MALFORMED, exc.message, **log)
        except OSError as exc:
            return refused(422, Reason.MALFORMED, _os_error(exc), **log)
        if spec.name == "exec" and store.lookup(envelope.idempotency_key) is None:
            # Fail closed before any intent: exec never falls back to running unconfined.
            try:
                shell.require_sandbox(self.settings)
            except SandboxUnavailable as exc:
                return refused(409, Reason.SANDBOX_UNAVAILABLE, exc.message, **log)
        try:
            begun = self.receipts.timed(
                store.begin,
                key=envelope.idempotency_key,
                job_id=envelope.job_id,
                attempt=envelope.attempt,
                slot_id=envelope.slot_id,
                generation=envelope.generation,
                tool=spec.name,
                **fields,
            )
        except KeyBoundToOtherJob as exc:
            return refused(409, Reason.KEY_BOUND_TO_OTHER_JOB, exc.message, **log)
        except ReceiptDurabilityError as exc:
            return self._poison(ctx, exc, log)
        receipt = begun.receipt
        if not begun.fresh and receipt.tool != spec.name:
            # A key names one call: answering git_commit with an exec's receipt, or
            # finishing a write_file's open intent with an rm, would be a lie (#15).
            return refused(
                422,
                Reason.MALFORMED,
                f"idempotency key {envelope.idempotency_key!r} belongs to a {receipt.tool} "
                f"call; a key names one call (use a new key for this {spec.name})",
                **log,
            )
        if not begun.fresh:
            if receipt.status != Status.INTENT:
                return replayed(receipt, log)
            if not judged(spec.name):
                # exec: the command may have run, in part or whole; never run it again.
                return outcome_unknown(receipt, log)
            # An intent with no outcome: a crash or a lost reply. Look at the tree.
            try:
                resolved = self.receipts.resolve(ctx, store, receipt)
            except ReceiptDurabilityError as exc:
                return self._poison(ctx, exc, log)
            if resolved.status == Status.APPLIED:
                return replayed(resolved, log)
        started = time.monotonic()
        status, result, detail, http = Status.APPLIED, None, None, 200
        try:
            result = self.hooks.effect(spec.name, ctx, args, envelope)
        except paths.PathRefused as exc:
            status, detail, http = (
                Status.FAILED,
                f"{Reason.OUTSIDE_WORKSPACE.value}: {exc.message}",
                403,
            )
        except ToolError as exc:
            status, detail = Status.FAILED, exc.message
        except FileNotFoundError as exc:
            status, detail = Status.FAILED, f"not found: {exc}"
        except OSError as exc:
            if spec.name == "exec":
                raise  # the command may have run: its intent stays open (outcome unknown)
            # The file tools replace atomically and git leaves its tree as it was when
            # it fails: the call failed and changed nothing (no space, no permission).
            status, detail = Status.FAILED, _os_error(exc)
        log["service_ms"] = round((time.monotonic() - started) * 1000.0, 2)
        self.hooks.after_effect(spec.name, envelope.idempotency_key)
        try:
            done = self.receipts.timed(
                store.finish,
                receipt,
                status,
                detail=detail,
                result=result,
                digest=(result or {}).get("digest"),
            )
        except ReceiptDurabilityError as exc:
            return self._poison(ctx, exc, log)
        log.update(receipt_job=done.job_id, receipt_generation=done.generation)
        if spec.name in ("run_tests", "exec") and result is not None:
            # I9: the mode actually used is on the record, and an unsandboxed run says so.
            log["sandbox"] = result.get("sandbox")
            if result.get("sandbox_warning"):
                log["sandbox_warning"] = result["sandbox_warning"]
        if http == 403:
            return Reply(
                403,
                {
                    "error": Reason.OUTSIDE_WORKSPACE.value,
                    "message": detail,
                    "receipt": done.to_wire(),
                },
                events.OUTCOME_REFUSED,
                Reason.OUTSIDE_WORKSPACE.value,
                log,
            )
        body = {
            "result": result if result is not None else {"error": detail},
            "receipt": done.to_wire(),
            "replayed": False,
        }
        outcome = events.OUTCOME_APPLIED if status == Status.APPLIED else events.OUTCOME_FAILED
        return Reply(200, body, outcome, None if status == Status.APPLIED else "tool_failed", log)

    def _poison(self, ctx: builtin.Context, exc: ToolError, log: dict[str, Any]) -> Reply:
        # The fsync failed: the kernel may have dropped the dirty pages, so a second
        # fsync could lie. The slot takes no new lease until an operator clears it.
        poisoned = "slot poisoned"
        try:
            self._mark_poisoned(ctx.slot_dir, f"receipt fsync failed: {exc.message}")
        except OSError as stamp_exc:
            # The same disk refused the stamp too. The store never writes again, so the
            # next call on this slot poisons it again (or fails the same way): the
            # caller still gets a classified outcome_unknown, never a bare 500.
            poisoned = f"the poisoned stamp could not be written either: {stamp_exc}"
        return Reply(
            500,
            {
                "error": Reason.OUTCOME_UNKNOWN.value,
                "message": f"the receipt could not be made durable; {poisoned} ({exc.message})",
            },
            events.OUTCOME_FAILED,
            Reason.OUTCOME_UNKNOWN.value,
            log,
        )

    def _mark_poisoned(self, slot_dir: Path, reason: str) -> None:
        """Stamp the slot poisoned, saying why; the caller holds the slot lock."""
        current = read_stamp(slot_dir)
        if current is None:
            return  # never leased: there is no lease to take away
        poisoned = current.model_copy(update={"state": SlotState.POISONED, "reason": reason})
        try:
            write_stamp(slot_dir, poisoned, fsync=self.fsync)
        except OSError:
            # Not durable, but written: the page cache outlives this process, so a
            # server restarted before the next call still finds the slot poisoned
            # (only a lost host forgets it, and a lost host's slots are settled anew).
            with contextlib.suppress(OSError):
                write_stamp(slot_dir, poisoned, fsync=_no_fsync)
            raise


def _no_fsync(fd: int, directory: str) -> None:
    """The fsync of a write that is kept even though the disk refused to make it durable."""


def _read(
    spec: registry.ToolSpec,
    ctx: builtin.Context,
    args: BaseModel,
    envelope: Envelope,
    log: dict[str, Any],
) -> Reply:
    """A read-only call: its result, or why it failed (nothing to record)."""

    def failed(message: str, reason: Reason) -> Reply:
        body = {"result": {"error": message}, "receipt": None, "replayed": False}
        return Reply(200, body, events.OUTCOME_FAILED, reason.value, log)

    try:
        result = run_tool(spec.name, ctx, args, envelope)
    except paths.PathRefused as exc:
        return refused(403, Reason.OUTSIDE_WORKSPACE, exc.message, **log)
    except FileNotFoundError as exc:
        missing = {"error": Reason.NOT_FOUND.value, "message": str(exc)}
        return Reply(404, missing, events.OUTCOME_FAILED, Reason.NOT_FOUND.value, log)
    except ToolError as exc:
        return failed(exc.message, exc.reason)
    except OSError as exc:
        return failed(_os_error(exc), Reason.MALFORMED)
    return Reply(
        200, {"result": result, "receipt": None, "replayed": False}, events.OUTCOME_READ, None, log
    )


def _allowed(slot_dir: Path, generation: int, tool: str) -> bool:
    """Whether the lease at ``generation`` may call ``tool`` (its token record's tools).

    A lease without a record (a stamp not written by ``SlotPool.lease``) narrows
    nothing; a record that cannot be read allows nothing (fail closed).
    """
    try:
        record = tokens.read_record(slot_dir, generation)
    except (OSError, ValueError):
        return False
    return record is None or record.allows(tool)


def _os_error(exc: OSError) -> str:
    """What the tree said, without the host's own paths (the caller knows its path)."""
    return f"the work tree refused the call: {exc.strerror or type(exc).__name__}"
