"""The pre-apply worker hook: may this request touch this slot, now?

Two faces, one decision:

* :func:`check_apply_envelope` -- the function the tool server calls under the slot
  lock before every call;
* the CLI of DESIGN §5, compatible with the seed-004 hook::

      python -m hooks.check_apply_envelope --slot SLOT_DIR --request REQUEST.json

  prints ``ok`` and exits 0, or prints the reason on stderr and exits with its code.

The request is the envelope (``job_id``, ``generation``, ``tool``,
``idempotency_key``; ``attempt`` and ``slot_id`` are checked when present).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.core.stamp import Stamp, StampError, read_stamp, utc_now
from tools import registry
from tools.envelope import verdict
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
EXIT_USAGE = 64
EXIT_MALFORMED = 65
EXIT_NO_STAMP = 66

# Test-only switch: with this set in the tool server's environment the hook lets
# every call through. It exists so the detector and the chaos campaign can prove
# they catch a cross-job apply when the fence is broken. Never set it in production.
DISABLE_ENV = "SLOTRUNNER_TEST_DISABLE_ENVELOPE_HOOK"


class MalformedRequest(ValueError):
    """The request is not a JSON object with the envelope's fields."""


def check_apply_envelope(
    slot_dir: Path,
    stamp: Stamp,
    request: dict[str, Any],
    now: datetime,
    receipts: ReceiptStore | None = None,
) -> Reason | None:
    """The verdict for one request against the slot's current stamp."""
    job_id, generation, attempt, tool, key = _fields(request)
    if "slot_id" in request and request["slot_id"] != stamp.slot_id:
        return Reason.SLOT_JOB_MISMATCH
    spec = registry.get(tool)
    # Unknown tools are treated as mutating: fail closed.
    mutating = spec.mutating if spec is not None else True
    reason = verdict(
        stamp,
        job_id=job_id,
        generation=generation,
        attempt=attempt,
        idempotency_key=key,
        mutating=mutating,
        now=now,
    )
    if reason is not None:
        return reason
    if key:
        store = receipts if receipts is not None else ReceiptStore(slot_dir)
        receipt = store.lookup(key)
        if receipt is not None and receipt.job_id != job_id:
            return Reason.KEY_BOUND_TO_OTHER_JOB
    return None


def _fields(request: dict[str, Any]) -> tuple[str, int, int | None, str, str | None]:
    if not isinstance(request, dict):
        raise MalformedRequest("the request must be a JSON object")
    missing = [name for name in ("job_id", "generation", "tool") if name not in request]
    if missing:
        raise MalformedRequest(f"the request lacks {', '.join(missing)}")
    job_id, generation, tool = request["job_id"], request["generation"], request["tool"]
    attempt, key = request.get("attempt"), request.get("idempotency_key")
    if not isinstance(job_id, str) or not job_id:
        raise MalformedRequest("job_id must be a non-empty string")
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise MalformedRequest("generation must be an integer")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        raise MalformedRequest("attempt must be an integer")
    if not isinstance(tool, str) or not tool:
        raise MalformedRequest("tool must be a non-empty string")
    if key is not None and not isinstance(key, str):
        raise MalformedRequest("idempotency_key must be a string")
    return job_id, generation, attempt, tool, key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hooks.check_apply_envelope",
        description="Check a tool request's envelope against a slot's stamp before applying it.",
        epilog="exit codes: 0 ok, 2 slot_job_mismatch, 3 stale_generation, "
        "4 missing_idempotency_key, 5 lease_expired, 6 key_bound_to_other_job, "
        "64 bad usage, 65 malformed request, 66 no stamp",
    )
    parser.add_argument("--slot", required=True, help="the slot directory (holds stamp.json)")
    parser.add_argument("--request", required=True, help="the request JSON file, or - for stdin")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    slot_dir = Path(args.slot)
    try:
        stamp = read_stamp(slot_dir)
    except StampError as exc:
        print(f"no usable stamp: {exc}", file=sys.stderr)
        return EXIT_NO_STAMP
    if stamp is None:
        print(f"no stamp: {slot_dir / 'stamp.json'} does not exist", file=sys.stderr)
        return EXIT_NO_STAMP
    try:
        text = sys.stdin.read() if args.request == "-" else Path(args.request).read_text()
        request = json.loads(text)
        reason = check_apply_envelope(slot_dir, stamp, request, utc_now())
    except FileNotFoundError:
        print(f"malformed request: {args.request} does not exist", file=sys.stderr)
        return EXIT_MALFORMED
    except (OSError, UnicodeDecodeError) as exc:
        print(f"malformed request: cannot read {args.request}: {exc}", file=sys.stderr)
        return EXIT_MALFORMED
    except json.JSONDecodeError as exc:
        print(f"malformed request: {args.request} is not JSON ({exc})", file=sys.stderr)
        return EXIT_MALFORMED
    except MalformedRequest as exc:
        print(f"malformed request: {exc}", file=sys.stderr)
        return EXIT_MALFORMED
    if reason is None:
        print("ok")
        return EXIT_OK
    print(reason.value, file=sys.stderr)
    return EXIT_CODES[reason]


if __name__ == "__main__":
    raise SystemExit(main())
