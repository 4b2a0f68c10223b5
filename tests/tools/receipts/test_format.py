"""The record and its line: the struct the store keeps, the pydantic model of the wire
and the lax reader, and what each reads and writes (tools/receipts/format.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticUndefined

from tools.receipts.format import (
    Receipt,
    ReceiptModel,
    Status,
    encode_line,
    parse_line,
    record_of,
)
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore

_BASE: dict[str, Any] = {
    "key": "job-a:a1:s0:write_file",
    "job_id": "job-a",
    "attempt": 1,
    "slot_id": "s1",
    "generation": 7,
    "tool": "write_file",
    "status": "intent",
    "ts": "2026-12-07T15:00:00.000000Z",
}


def _line(**fields: Any) -> bytes:
    return json.dumps({**_BASE, **fields}).encode() + b"\n"


def _limits(meta: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for m in meta:
        for name in ("min_length", "ge"):
            value = getattr(m, name, None)
            if value is not None:
                found[name] = value
    return found


def test_the_wire_model_has_the_records_fields_defaults_and_limits() -> None:
    """ReceiptModel is the struct field for field: order, type, default and limits."""
    fields = msgspec.structs.fields(Receipt)
    model = ReceiptModel.model_fields
    assert [f.name for f in fields] == list(model)
    for f in fields:
        info = model[f.name]
        default = None if f.default is msgspec.NODEFAULT else f.default
        assert (info.default if info.default is not PydanticUndefined else None) == default
        assert info.is_required() == (f.default is msgspec.NODEFAULT), f.name
        struct_type, *meta = get_args(f.type) if get_origin(f.type) is Annotated else (f.type,)
        assert info.annotation == struct_type, f.name
        assert _limits(info.metadata) == _limits(list(meta)), f.name


_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | st.sampled_from(["intent", "applied", "failed", "", "3", " 3"])
)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from([f.name for f in msgspec.structs.fields(Receipt)] + ["newer"]),
        _json,
        max_size=4,
    ),
    dropped=st.sets(st.sampled_from(sorted(_BASE)), max_size=2),
)
def test_a_line_the_strict_decoder_reads_the_wire_model_reads_the_same(
    changes: dict[str, Any], dropped: set[str]
) -> None:
    """parse_line tries the struct's strict decoder first: what it accepts must be a
    record for the model too, with the same values, so the fast path never makes a
    line valid or different that the model would not."""
    fields = {k: v for k, v in {**_BASE, **changes}.items() if k not in dropped}
    raw = json.dumps(fields).encode() + b"\n"
    try:
        strict = msgspec.json.decode(raw, type=Receipt)
    except msgspec.DecodeError:
        return
    model = ReceiptModel.model_validate(json.loads(raw))
    assert Receipt(**dict(model)) == strict


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"attempt": "3"}, "attempt", 3),
        ({"attempt": " 3"}, "attempt", 3),
        ({"attempt": True}, "attempt", 1),
        ({"generation": 4.0}, "generation", 4),
        ({"generation": 2**70}, "generation", 2**70),
        ({"relpath": "caf\u00e9"}, "relpath", "caf\u00e9"),
        ({"relpath": "bad\udc80name"}, "relpath", "bad\udc80name"),
    ],
)
def test_a_lax_line_the_model_accepts_is_still_a_record(
    fields: dict[str, Any], field: str, value: Any
) -> None:
    """Lines the strict decoder refuses but pydantic read as records read the same."""
    record = parse_line(_line(**fields))
    assert record is not None
    assert getattr(record, field) == value
    assert record.status is Status.INTENT


@pytest.mark.parametrize(
    "fields",
    [
        {"key": ""},
        {"key": "bad\udc80key"},
        {"attempt": -1},
        {"attempt": 1.5},
        {"status": "done"},
        {"ts": 5},
        {"result": []},
    ],
)
def test_a_line_neither_reader_accepts_reads_as_absent(fields: dict[str, Any]) -> None:
    assert parse_line(_line(**fields)) is None


def test_a_nan_in_a_result_is_written_as_nan_and_reads_back(slot: Path) -> None:
    """msgspec would write NaN as null: the record goes through json.dumps instead."""
    store = ReceiptStore(slot)
    began = store.begin(key="k1", job_id="job-a", attempt=1, slot_id="s1", generation=7, tool="t")
    done = store.finish(began.receipt, Status.APPLIED, result={"score": math.nan, "none": None})
    last = (slot / RECEIPTS_FILE).read_bytes().splitlines()[-1]
    assert b'"score":NaN' in last and b'"none":null' in last
    for record in (done, ReceiptStore(slot).lookup("k1")):
        assert record is not None and record.result is not None
        assert math.isnan(record.result["score"]) and record.result["none"] is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"key": ""}, "key"), ({"attempt": -1}, "attempt"), ({"tool": ""}, "tool")],
)
def test_the_store_refuses_an_invalid_record_and_writes_nothing(
    slot: Path, fields: dict[str, Any], problem: str
) -> None:
    """Building a struct checks nothing: the store checks the line it is about to write."""
    store = ReceiptStore(slot)
    args: dict[str, Any] = {
        "key": "k1",
        "job_id": "job-a",
        "attempt": 1,
        "slot_id": "s1",
        "generation": 7,
        "tool": "t",
        **fields,
    }
    with pytest.raises(ValueError, match=problem):
        store.begin(**args)
    path = slot / RECEIPTS_FILE
    assert not path.exists() or path.read_bytes() == b""
    assert store.broken is None and store.lookup(str(args["key"])) is None


def test_a_result_json_cannot_carry_is_refused_before_the_write(slot: Path) -> None:
    store = ReceiptStore(slot)
    began = store.begin(key="k1", job_id="job-a", attempt=1, slot_id="s1", generation=7, tool="t")
    before = (slot / RECEIPTS_FILE).read_bytes()
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        store.finish(began.receipt, Status.APPLIED, result={"x": object()})
    assert (slot / RECEIPTS_FILE).read_bytes() == before
    assert store.open_intents() == [began.receipt]


@pytest.mark.parametrize(
    "result",
    [None, {"bytes": 120}, {"path": "null.py"}, {"nested": {"a": [1, None, "\u00e9"]}}],
)
def test_a_record_reads_back_from_its_line_as_itself(result: dict[str, Any] | None) -> None:
    """record_of: what the store keeps is what a reader of the line gets, and equal to
    what was built, whichever encoder wrote the line."""
    built = Receipt(**{**_BASE, "status": Status.APPLIED, "result": result})
    record, line = record_of(built)
    assert record == built and line == encode_line(built)
    assert line.isascii() and line.count(b"\n") == 1
    assert parse_line(line) == built
