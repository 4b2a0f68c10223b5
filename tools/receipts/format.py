"""One line of ``receipts.jsonl``: the record, its status, and its line encoding.

A record is one compact ASCII JSON object on one line (docs/architecture.md
§Receipts); a line that is not one whole valid record reads as absent. The store that
appends and reads these lines is :mod:`tools.receipts.log` and
:mod:`tools.receipts.store`.

The record is a ``msgspec`` struct: it is made twice for every durable write, and
building and validating a pydantic model was most of the store's own Python per
record around a real sync (#17, bench/receipts.py's ``receipts.lean_model``). Its
constraints are checked where a record enters the store: a line is decoded with
them, and the store keeps what :func:`record_of` read back from the line it wrote,
never a record it only built.
:class:`ReceiptModel`, the same fields as a pydantic model, is the wire schema
(tools/server/wire.py) and reads the lines the struct's strict decoder refuses: what
the record accepted before it was a struct (``"1"`` for ``1``, a ``NaN`` in a
result), so no line that was a record reads as absent now.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field

# Written before the next record when the file ends in an unterminated (torn) line.
# A bare "\n" is not enough: a torn tail can be a complete JSON object that lost only
# its newline (its fsync never returned, so its caller never applied anything), and a
# bare "\n" would turn it into a valid record for every later reader -- a phantom
# intent or apply. " #torn" can never continue a JSON text (no quote closes an open
# string, "#" is not JSON outside one), so the torn line stays malformed for good.
# Marker and record go in one append_record write, so no reader sees one without the other.
TORN_TERMINATOR = b" #torn\n"

_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Count = Annotated[int, msgspec.Meta(ge=0)]


class Status(StrEnum):
    INTENT = "intent"
    APPLIED = "applied"
    FAILED = "failed"


class Receipt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One line of ``receipts.jsonl``, its fields in the on-disk order of
    docs/architecture.md §Receipts.

    Building one checks nothing: a record the store keeps is one :func:`record_of`
    read from its line. Fields the struct does not name are ignored when a line is
    read: a valid record carrying a field from a newer version must still count as
    present; reading it as absent could let the key be applied a second time.
    """

    key: _Name
    job_id: _Name
    attempt: _Count
    slot_id: _Name
    generation: _Count
    tool: _Name
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
        wire: dict[str, Any] = msgspec.to_builtins(self)
        return wire


class ReceiptModel(BaseModel):
    """:class:`Receipt` as a pydantic model, field for field (a test holds them
    equal): the wire schema (tools/server/wire.py), and the lax reader of
    :func:`parse_line` for the lines the struct's strict decoder refuses."""

    # extra="ignore": as the struct. ser_json_inf_nan: a NaN in a result is written
    # as NaN (as json.dumps would), not silently turned into null.
    model_config = ConfigDict(
        title="Receipt", frozen=True, extra="ignore", ser_json_inf_nan="constants"
    )

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


_DECODER = msgspec.json.Decoder(Receipt)
_ENCODER = msgspec.json.Encoder()


def parse_line(raw: bytes) -> Receipt | None:
    """A record, or ``None`` for anything that is not one whole valid record."""
    if not raw.endswith(b"\n"):
        return None
    try:
        return _DECODER.decode(raw)  # a line as the store writes it
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting
        return None
    if not isinstance(obj, dict):
        return None
    try:
        model = ReceiptModel.model_validate(obj)
    except ValueError:  # pydantic's ValidationError
        return None
    return Receipt(**dict(model))


def encode_line(receipt: Receipt) -> bytes:
    """The record line of ``receipt``: compact JSON, ASCII only, ``None`` fields left out."""
    try:
        raw: bytes | None = _ENCODER.encode(receipt)
    except (TypeError, ValueError):  # a lone surrogate, a value JSON has no form for
        raw = None
    # msgspec writes a NaN in a result as null and text as UTF-8: such a record (and,
    # rarely, one whose text holds "null") is written by json.dumps instead.
    if raw is None or b"null" in raw or not raw.isascii():
        try:
            text = json.dumps(receipt.to_wire(), separators=(",", ":"), ensure_ascii=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"receipt for key {receipt.key!r} is not JSON-serialisable: {exc}"
            ) from exc
        raw = text.encode("ascii")
    return raw + b"\n"


def record_of(receipt: Receipt) -> tuple[Receipt, bytes]:
    """The line of ``receipt`` and the record read back from it: what a reader of the
    file will see, checked as every line is (``ValueError`` if it is not a record).
    The store keeps that copy, so its index holds the file's value and no caller's
    dict (a ``result`` changed later) can change it."""
    line = encode_line(receipt)
    record = parse_line(line)
    if record is None:
        try:  # for the reason, naming the field
            ReceiptModel.model_validate(receipt.to_wire())
            why = "its line does not read back"
        except ValueError as exc:
            why = str(exc)
        raise ValueError(f"receipt for key {receipt.key!r} is not a valid record: {why}")
    return record, line
