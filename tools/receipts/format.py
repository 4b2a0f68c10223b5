"""One line of ``receipts.jsonl``: the record model, its status, and its line encoding.

A record is one compact ASCII JSON object on one line (docs/architecture.md
§Receipts); a line that is not one whole valid record reads as absent. The store that
appends and reads these lines is :mod:`tools.receipts.log` and
:mod:`tools.receipts.store`.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Written before the next record when the file ends in an unterminated (torn) line.
# A bare "\n" is not enough: a torn tail can be a complete JSON object that lost only
# its newline (its fsync never returned, so its caller never applied anything), and a
# bare "\n" would turn it into a valid record for every later reader -- a phantom
# intent or apply. " #torn" can never continue a JSON text (no quote closes an open
# string, "#" is not JSON outside one), so the torn line stays malformed for good.
# Marker and record go in one append_record write, so no reader sees one without the other.
TORN_TERMINATOR = b" #torn\n"


class Status(StrEnum):
    INTENT = "intent"
    APPLIED = "applied"
    FAILED = "failed"


class Receipt(BaseModel):
    """One line of ``receipts.jsonl``, its fields in the on-disk order of
    docs/architecture.md §Receipts."""

    # extra="ignore": a valid record carrying a field from a newer version must still
    # count as present; reading it as absent could let the key be applied a second time.
    # ser_json_inf_nan: a NaN in a result is written as NaN (as json.dumps would), not
    # silently turned into null.
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    key: str = Field(min_length=1)
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    slot_id: str = Field(min_length=1)
    generation: int = Field(ge=0)
    tool: str = Field(min_length=1)
    relpath: str | None = None
    digest: str | None = None
    status: Status
    ts: str
    detail: str | None = None
    result: dict[str, Any] | None = None
    pre_digest: str | None = None
    patch_sha256: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """A JSON-able dict without the fields that are ``None``."""
        return self.model_dump(mode="json", exclude_none=True)


# The model's own serializer, called without model_dump_json's wrapper (encode_line).
_SERIALIZER = Receipt.__pydantic_serializer__


def parse_line(raw: bytes) -> Receipt | None:
    """A record, or ``None`` for anything that is not one whole valid record."""
    if not raw.endswith(b"\n"):
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting
        return None
    if not isinstance(obj, dict):
        return None
    try:
        return Receipt.model_validate(obj)
    except ValueError:  # pydantic's ValidationError
        return None


def encode_line(receipt: Receipt) -> bytes:
    """The record line of ``receipt``: compact JSON, ASCII only, ``None`` fields left out."""
    try:
        # pydantic-core writes the JSON bytes in one call (a record is encoded on every
        # durable write; its serializer is called without model_dump_json's wrapper and
        # decode); its output is used when it is plain ASCII, as lines are.
        raw: bytes | None = _SERIALIZER.to_json(receipt, exclude_none=True)
    except ValueError:  # e.g. a lone surrogate, which only an escape can carry
        raw = None
    if raw is None or not raw.isascii():
        try:
            text = json.dumps(receipt.to_wire(), separators=(",", ":"), ensure_ascii=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"receipt for key {receipt.key!r} is not JSON-serialisable: {exc}"
            ) from exc
        raw = text.encode("ascii")
    return raw + b"\n"
