"""The pre-apply hook as a CLI: may this request touch this slot, now?

The decision is :func:`tools.envelope.verdict`, the one the tool server applies under
the slot lock before every call; this command only reads its inputs (the slot's
stamp, the request, the key's receipt) and turns the verdict into an exit code.
Its usage and exit codes are a contract (docs/architecture.md §Envelope hook)::

    python -m hooks.check_apply_envelope --slot SLOT_DIR --request REQUEST.json

prints ``ok`` and exits 0, or prints the reason on stderr and exits with its code.
The request is the envelope (``job_id``, ``generation``, ``tool``,
``idempotency_key``; ``attempt`` and ``slot_id`` are checked when present).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from runner.core.stamp import STAMP_FILE, StampError, read_stamp, utc_now
from tools.envelope import MalformedRequest, is_mutating, parse_request, verdict
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore

EXIT_OK = 0
EXIT_CODES: dict[Reason, int] = {
    Reason.SLOT_JOB_MISMATCH: 2,
    Reason.STALE_GENERATION: 3,
    Reason.MISSING_IDEMPOTENCY_KEY: 4,
    Reason.LEASE_EXPIRED: 5,
    Reason.KEY_BOUND_TO_OTHER_JOB: 6,
    # A poisoned slot takes no call at all; it is reported like an expired lease.
    Reason.SLOT_POISONED: 5,
}
EXIT_USAGE = 64  # sysexits EX_USAGE
EXIT_MALFORMED = 65  # EX_DATAERR: the request
EXIT_NO_STAMP = 66  # EX_NOINPUT: the slot's stamp (or its receipts) cannot be read


class _UsageError(click.UsageError):
    exit_code = EXIT_USAGE


class _HookCommand(click.Command):
    """Click's usage errors exit 64 here (sysexits), not click's 2: the hook's contract."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _UsageError(exc.format_message(), exc.ctx) from None


def _fail(ctx: click.Context, code: int, message: str) -> NoReturn:
    click.echo(message, err=True)
    ctx.exit(code)


def _read_request(ctx: click.Context, source: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        return json.loads(text)
    except FileNotFoundError:
        _fail(ctx, EXIT_MALFORMED, f"malformed request: {source} does not exist")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(ctx, EXIT_MALFORMED, f"malformed request: cannot read {source}: {exc}")
    except ValueError as exc:  # not JSON, or a number no int can hold (over 4300 digits)
        _fail(ctx, EXIT_MALFORMED, f"malformed request: {source} is not JSON ({exc})")
    except RecursionError:
        _fail(ctx, EXIT_MALFORMED, f"malformed request: {source} nests too deeply")


@click.command(
    cls=_HookCommand,
    help="Check a tool request's envelope against a slot's stamp before applying it.",
    epilog="\b\nexit codes: 0 ok, 2 slot_job_mismatch, 3 stale_generation,\n"
    "4 missing_idempotency_key, 5 lease_expired, 6 key_bound_to_other_job,\n"
    "64 bad usage, 65 malformed request, 66 no stamp",
)
@click.option(
    "--slot",
    "slot_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="the slot directory (holds stamp.json)",
)
@click.option("--request", "source", required=True, help="the request JSON file, or - for stdin")
@click.pass_context
def main(ctx: click.Context, slot_dir: Path, source: str) -> None:
    try:
        stamp = read_stamp(slot_dir)
    except (StampError, OSError) as exc:
        _fail(ctx, EXIT_NO_STAMP, f"no usable stamp: {exc}")
    if stamp is None:
        _fail(ctx, EXIT_NO_STAMP, f"no stamp: {slot_dir / STAMP_FILE} does not exist")
    try:
        request = parse_request(_read_request(ctx, source))
    except MalformedRequest as exc:
        _fail(ctx, EXIT_MALFORMED, f"malformed request: {exc.message}")
    holder = None
    if request.idempotency_key:
        try:
            receipt = ReceiptStore(slot_dir).lookup(request.idempotency_key)
        except OSError as exc:
            _fail(ctx, EXIT_NO_STAMP, f"cannot read the receipts of {slot_dir}: {exc}")
        holder = receipt.job_id if receipt is not None else None
    reason = verdict(
        stamp,
        job_id=request.job_id,
        generation=request.generation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        mutating=is_mutating(request.tool),
        now=utc_now(),
        slot_id=request.slot_id,
        key_holder=holder,
    )
    if reason is None:
        click.echo("ok")
        return
    _fail(ctx, EXIT_CODES[reason], reason.value)


if __name__ == "__main__":
    main(prog_name="python -m hooks.check_apply_envelope")
