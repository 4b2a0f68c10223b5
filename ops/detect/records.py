"""What one log line is to the detector: a lease, an apply, a malformed line, or nothing.

Two spellings of the same records. The reader decodes lines straight into the msgspec
structs :class:`LeasedLine`, :class:`ReleasedLine` and :class:`AppliedLine` (a tagged
union on ``event``: msgspec checks every field's presence and type in C, which is what
makes reading fast). :class:`Lease` and :class:`Apply` are the same records as plain
tuples, for code that builds them by hand. The rules read either through the
:class:`LeaseRecord` / :class:`ApplyRecord` protocols.

:func:`parse_line` is the one definition of a line's meaning. :func:`decode_array`
decodes many lines in one call and must agree with it line for line: when a batch
fails (any line not valid JSON, another event, a missing or mistyped field) the
caller falls back to :func:`parse_line` per line, which decodes leniently and names
the problem.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, NamedTuple, Protocol

import msgspec

from runner.core.events import (
    COMMON_FIELDS,
    LEASE_FIELDS,
    OUTCOME_APPLIED,
    SLOT_LEASED,
    SLOT_RELEASED,
    TOOL_RESULT,
    TOOL_RESULT_FIELDS,
)
from tools.names import MUTATING_TOOLS

MALFORMED = "malformed"
# Where a record came from is set by the reader after decoding, under JSON names no
# writer uses: a line's own "path" or "line" field never lands here.
_PATH = msgspec.field(default="", name="__ops_detect_path__")
_LINE = msgspec.field(default=0, name="__ops_detect_line__")


class LeaseRecord(Protocol):
    @property
    def released(self) -> bool: ...
    @property
    def host(self) -> str: ...
    @property
    def slot_id(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def ts(self) -> str: ...


class ApplyRecord(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def slot_id(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def tool(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def receipt_job(self) -> str | None: ...
    @property
    def ts(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def line(self) -> int: ...


class Lease(NamedTuple):
    released: bool  # False for slot_leased, True for slot_released
    host: str
    slot_id: str
    generation: int
    job_id: str
    attempt: int
    ts: str
    path: str
    line: int


class Apply(NamedTuple):
    host: str
    slot_id: str
    generation: int
    job_id: str
    attempt: int
    tool: str
    key: str
    receipt_job: str | None
    ts: str
    path: str
    line: int


class Malformed(NamedTuple):
    path: str
    line: int
    reason: str
    ts: str = ""

    @property
    def kind(self) -> str:
        return MALFORMED

    def to_json(self) -> dict[str, Any]:
        return {"kind": MALFORMED, "path": self.path, "line": self.line, "reason": self.reason}


NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


# gc=False: these hold only strings, ints and Raw, never a cycle; untracked structs
# are cheaper to make and never scanned by the collector.
class _LeaseLine(msgspec.Struct, gc=False):
    """The fields shared by ``slot_leased`` and ``slot_released`` lines."""

    ts: str
    host: str
    slot_id: str
    generation: int
    job_id: str
    attempt: int
    path: str = _PATH
    line: int = _LINE


class LeasedLine(_LeaseLine, tag_field="event", tag=SLOT_LEASED, gc=False):
    released: ClassVar[bool] = False


class ReleasedLine(_LeaseLine, tag_field="event", tag=SLOT_RELEASED, gc=False):
    released: ClassVar[bool] = True


class AppliedLine(msgspec.Struct, tag_field="event", tag=TOOL_RESULT, gc=False):
    """A ``tool_result`` line; a record only when it is an apply of a mutating tool."""

    ts: str
    host: str
    job_id: str
    attempt: int
    slot_id: str
    generation: int = msgspec.field(name="slot_generation")
    tool: str
    # null on read-only calls, "" nowhere: both take the lenient road (no apply / malformed)
    key: NonEmpty = msgspec.field(name="idempotency_key")
    outcome: str
    # Never read, only required: a tool_result without them breaks the contract.
    http_status: msgspec.Raw
    queue_wait_ms: msgspec.Raw
    service_ms: msgspec.Raw
    receipt_job: str | None = None
    path: str = _PATH
    line: int = _LINE


Line = LeasedLine | ReleasedLine | AppliedLine
Record = LeasedLine | ReleasedLine | AppliedLine | Lease | Apply | Malformed
APPLY_TYPES = (AppliedLine, Apply)

_decode_one = msgspec.json.Decoder(Line).decode
_decode_many = msgspec.json.Decoder(list[Line]).decode
_decode_any = msgspec.json.Decoder().decode
_TOOL_RESULT_KEYS = frozenset(COMMON_FIELDS + TOOL_RESULT_FIELDS)
_LEASE_KEYS = frozenset(COMMON_FIELDS + LEASE_FIELDS)
BAD_APPLY = "apply with a mistyped or empty field"


def as_array(lines: list[bytes]) -> bytes:
    """Whole lines as one JSON array, decodable in one call; a newline before each comma
    (JSON whitespace) lets :func:`array_lines` cut it back into exactly these lines."""
    return b"[" + b"\n,".join(lines) + b"]"


def array_lines(array: bytes) -> list[bytes]:
    return array[1:-1].split(b"\n,") if len(array) > 2 else []


def decode_array(array: bytes) -> list[Line]:
    """An :func:`as_array` of lines in one C call; raises ``msgspec.MsgspecError`` if any
    is not a well-formed lease, release or tool_result (then ask :func:`parse_line`)."""
    return _decode_many(array)


def is_apply(rec: AppliedLine) -> bool:
    """A tool_result the rules judge: applied, by a mutating tool."""
    return rec.outcome == OUTCOME_APPLIED and rec.tool in MUTATING_TOOLS


def parse_line(raw: bytes, path: str, line: int) -> Record | None:
    """One log line -> a lease, an apply, a malformed marker, or None (irrelevant)."""
    try:
        rec = _decode_one(raw)
    except msgspec.ValidationError:  # valid JSON, but not a well-formed record of ours
        return _parse_lenient(raw, path, line)
    except msgspec.DecodeError as exc:
        return Malformed(path, line, _why(exc))
    if type(rec) is AppliedLine and not is_apply(rec):
        return None
    rec.path, rec.line = path, line
    return rec


def _parse_lenient(raw: bytes, path: str, line: int) -> Record | None:
    """The slow road, only for lines the typed decoder refused: say what is wrong."""
    try:
        obj = _decode_any(raw)
    except msgspec.DecodeError as exc:  # the typed decoder stops at the first wrong field
        return Malformed(path, line, _why(exc))
    if type(obj) is not dict:
        return Malformed(path, line, "not a JSON object")
    ts, event, host = obj.get("ts"), obj.get("event"), obj.get("host")
    if type(ts) is not str or type(event) is not str or type(host) is not str:
        return Malformed(path, line, "no ts, event or host string")
    if event == TOOL_RESULT:
        if not obj.keys() >= _TOOL_RESULT_KEYS:
            return Malformed(path, line, f"tool_result without {_missing(obj, _TOOL_RESULT_KEYS)}")
        tool = obj["tool"]
        if obj["outcome"] != OUTCOME_APPLIED or type(tool) is not str or tool not in MUTATING_TOOLS:
            return None
        slot, gen, job = obj["slot_id"], obj["slot_generation"], obj["job_id"]
        attempt, key, receipt_job = obj["attempt"], obj["idempotency_key"], obj.get("receipt_job")
        if not (
            _ids(slot, gen, job, attempt)
            and type(key) is str
            and key
            and (receipt_job is None or type(receipt_job) is str)
        ):
            return Malformed(path, line, BAD_APPLY)
        return Apply(host, slot, gen, job, attempt, tool, key, receipt_job, ts, path, line)
    if event in (SLOT_LEASED, SLOT_RELEASED):
        if not obj.keys() >= _LEASE_KEYS:
            return Malformed(path, line, f"{event} without {_missing(obj, _LEASE_KEYS)}")
        slot, gen, job, attempt = obj["slot_id"], obj["generation"], obj["job_id"], obj["attempt"]
        if not _ids(slot, gen, job, attempt):
            return Malformed(path, line, f"{event} with a mistyped field")
        return Lease(event == SLOT_RELEASED, host, slot, gen, job, attempt, ts, path, line)
    return None


def _why(exc: msgspec.DecodeError) -> str:
    return "more than one JSON value" if "trailing characters" in str(exc) else "not JSON"


def _ids(slot: object, gen: object, job: object, attempt: object) -> bool:
    # type() is, not isinstance: a JSON true is no generation number.
    return type(slot) is str and type(gen) is int and type(job) is str and type(attempt) is int


def _missing(obj: dict[str, Any], wanted: frozenset[str]) -> str:
    return ", ".join(sorted(wanted - obj.keys()))
