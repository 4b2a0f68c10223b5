"""Find ownership and at-most-once violations in slotrunner's JSONL event logs.

An *apply* is a ``tool_result`` line with ``outcome == "applied"`` on a tool in
``MUTATING_TOOLS``; nothing else is judged. Each apply is checked against the
ownership timeline of its ``(host, slot_id)`` (slot ids repeat across hosts), rebuilt
from ``slot_leased`` / ``slot_released`` lines in log order:

==========================  =====================================================
``stale_generation_apply``  its generation is below the slot's current one: a newer
                            generation had been leased before the line was written
``cross_job_apply``         its ``receipt_job`` is not its ``job_id``, or its job is
                            not the job holding the lease of that generation
``unowned_apply``           that generation of that slot was never leased in the
                            logs read (slot unseen, or generation ahead of the lease)
``duplicate_apply``         its idempotency key was applied before (``replayed``
                            lines are the cure, not the disease: they never count)
==========================  =====================================================

Precedence: an apply gets at most one *ownership* kind, stale > cross_job > unowned.
Stale wins because a recycled slot explains everything else about the line; a
foreign receipt outranks "unowned" because it names the victim. ``duplicate_apply``
is judged on its own, so the replayed buffered apply of seed 004 (old envelope,
same key) is two incidents on one line: stale_generation_apply and duplicate_apply.
:func:`judge_apply` also returns two kinds only ``ops.verify`` reports (the owner's
job with another attempt, and an apply after the lease was released).

Memory is constant in the number of lines: one small tuple per (host, slot), and one
16-byte blake2b digest per distinct applied key: 83 bytes each with the set's own
overhead (measured with tracemalloc: 1,000,000 keys, 83 MB). The key set is the one
thing that must grow: "applied at most once, ever" cannot be checked with less.

Reading is the hot path. A line is parsed only when it can matter (it contains
``"applied"``, ``"slot_leased"`` or ``"slot_released"``); every other line is only
checked for the shape of one JSON object naming an ``"event"``.
A line is *malformed* when it fails that shape check, or is a candidate that is not a
JSON object or lacks (or mistypes) a field the contract names. Malformed lines are
counted and reported, never fatal. ``ops.verify`` turns the pre-filter off and parses
every line, so no spelling of an apply can slip past it. Blank lines are skipped.

One input is replayed in line order, which is the write order (one ``O_APPEND`` write
per line). Several inputs are merged by ``ts`` (``heapq.merge`` over per-file streams,
each assumed roughly ordered). The logs read must reach back to the leases they
judge: an apply whose lease is in an older, unread file is an ``unowned_apply``.
"""

from __future__ import annotations

import glob
import gzip
import heapq
import json
import re
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from hashlib import blake2b
from typing import Any, NamedTuple

from runner.events import (
    COMMON_FIELDS,
    LEASE_FIELDS,
    OUTCOME_APPLIED,
    SLOT_LEASED,
    SLOT_RELEASED,
    TOOL_RESULT,
    TOOL_RESULT_FIELDS,
)
from tools.registry import MUTATING_TOOLS


class Kind(StrEnum):
    STALE = "stale_generation_apply"
    CROSS_JOB = "cross_job_apply"
    UNOWNED = "unowned_apply"
    DUPLICATE = "duplicate_apply"
    # Reported by ops.verify only: inside the right generation, outside the lease.
    WRONG_ATTEMPT = "wrong_attempt_apply"
    AFTER_RELEASE = "after_release_apply"


DETECT_KINDS = (Kind.STALE, Kind.CROSS_JOB, Kind.UNOWNED, Kind.DUPLICATE)
MALFORMED = "malformed"


# -- records -----------------------------------------------------------------------


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


Record = Lease | Apply | Malformed

# json's own C scanner without json.loads' per-call encoding sniffing and whitespace
# regexes, which cost more than the parse itself on a 300-byte line.
_decode = json.JSONDecoder().raw_decode
_TOOL_RESULT_KEYS = frozenset(COMMON_FIELDS + TOOL_RESULT_FIELDS)
_LEASE_KEYS = frozenset(COMMON_FIELDS + LEASE_FIELDS)


def parse_line(raw: bytes, path: str, line: int) -> Record | None:
    """One log line -> a lease, an apply, a malformed marker, or None (irrelevant)."""
    try:
        text = raw.decode().strip()
        obj, end = _decode(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Malformed(path, line, "not JSON")
    if end != len(text):
        return Malformed(path, line, "more than one JSON value")
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
            return Malformed(path, line, "apply with a mistyped or empty field")
        return Apply(host, slot, gen, job, attempt, tool, key, receipt_job, ts, path, line)
    if event in (SLOT_LEASED, SLOT_RELEASED):
        if not obj.keys() >= _LEASE_KEYS:
            return Malformed(path, line, f"{event} without {_missing(obj, _LEASE_KEYS)}")
        slot, gen, job, attempt = obj["slot_id"], obj["generation"], obj["job_id"], obj["attempt"]
        if not _ids(slot, gen, job, attempt):
            return Malformed(path, line, f"{event} with a mistyped field")
        return Lease(event == SLOT_RELEASED, host, slot, gen, job, attempt, ts, path, line)
    return None


def _ids(slot: object, gen: object, job: object, attempt: object) -> bool:
    # type() is, not isinstance: a JSON true is no generation number.
    return type(slot) is str and type(gen) is int and type(job) is str and type(attempt) is int


def _missing(obj: dict[str, Any], wanted: frozenset[str]) -> str:
    return ", ".join(sorted(wanted - obj.keys()))


# -- reading -----------------------------------------------------------------------


@dataclass
class Tally:
    """What reading one input found; ``error`` is set when the input is unusable."""

    path: str  # what to open; "-" is stdin
    lines: int = 0
    blank: int = 0
    malformed: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        """The name records carry for this input."""
        return "<stdin>" if self.path == "-" else self.path

    @property
    def problem(self) -> str | None:
        """Why this input cannot stand as a log (None when it can)."""
        if self.error is not None:
            return f"{self.error} after {self.lines} lines" if self.lines else self.error
        if self.lines > self.blank and self.malformed == self.lines - self.blank:
            return "not a slotrunner log (no line of it is a log record)"
        return None


def _mark(text: str) -> bytes:
    return json.dumps(text).encode()


# One regex search is cheaper than three ``in`` tests on a line that has none of them.
_CANDIDATE = re.compile(
    b"|".join(re.escape(_mark(name)) for name in (OUTCOME_APPLIED, SLOT_LEASED, SLOT_RELEASED))
).search
_EVENT = _mark("event")  # structlog's key for the event name, first on its lines: found at once
_SHAPE = "not one JSON object naming an event"


def scan(lines: Iterable[bytes], tally: Tally, *, prefilter: bool = True) -> Iterator[Record]:
    """The records of one stream of lines; counts go to ``tally`` (line numbers continue it)."""
    candidate, event = _CANDIDATE, _EVENT
    path, n = tally.label, tally.lines
    try:
        for raw in lines:
            n += 1
            if prefilter and candidate(raw) is None:
                body = raw.strip()
                if not body:
                    tally.blank += 1
                    continue
                if body[:1] == b"{" and body[-1:] == b"}" and event in body:
                    continue
                rec: Record | None = Malformed(path, n, _SHAPE)
            elif not prefilter and not raw.strip():
                tally.blank += 1
                continue
            else:
                rec = parse_line(raw, path, n)
                if rec is None:
                    continue
            if type(rec) is Malformed:
                tally.malformed += 1
            yield rec  # type: ignore[misc]
    finally:
        tally.lines = n


def expand(paths: Sequence[str]) -> list[str]:
    """Paths with globs expanded (sorted); ``-`` is stdin. A glob matching nothing is kept."""
    out: list[str] = []
    for path in paths:
        matches = sorted(glob.glob(path)) if glob.has_magic(path) and path != "-" else []
        out.extend(matches or [path])
    return out


GZIP_MAGIC = b"\x1f\x8b"


def read_lines(tally: Tally) -> Iterator[bytes]:
    """Every line of ``tally.path``: a plain file, a gzip one (sniffed by its magic, so a
    rotated ``.1.gz`` is read too) or stdin for ``-``. An open or read failure ends the
    lines and sets ``tally.error``: one bad input never stops the others."""
    raw: Any  # a BufferedReader: peek() sniffs without consuming, even on a pipe
    try:
        raw = sys.stdin.buffer if tally.path == "-" else open(tally.path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        tally.error = "no such file"
        return
    except OSError as exc:
        tally.error = f"cannot read ({exc.strerror or exc})"
        return
    try:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == GZIP_MAGIC else raw
        yield from stream
    except (OSError, EOFError, zlib.error) as exc:  # a damaged .gz, an I/O error
        tally.error = f"read failed ({exc})"
    finally:
        if raw is not sys.stdin.buffer:
            raw.close()


def instant(ts: str) -> float:
    """A timestamp as epoch seconds, for merging files; unparsable sorts first (kept in place)."""
    try:
        parsed = datetime.fromisoformat(ts)
    except ValueError:
        return float("-inf")
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def merge_by_ts(streams: Sequence[Iterable[Record]]) -> Iterator[Record]:
    """A k-way merge of per-file streams, each assumed roughly ordered by ``ts``."""
    if len(streams) == 1:
        return iter(streams[0])  # one file: its line order is the write order
    return heapq.merge(*streams, key=lambda rec: instant(rec.ts))


def read_records(
    paths: Sequence[str], *, prefilter: bool = True
) -> tuple[Iterator[Record], list[Tally]]:
    """The records of every input, merged by ``ts``, and one tally per input."""
    tallies = [Tally(path) for path in expand(paths)]
    streams = [scan(read_lines(tally), tally, prefilter=prefilter) for tally in tallies]
    return merge_by_ts(streams), tallies


# -- rules (pure) ------------------------------------------------------------------


class SlotState(NamedTuple):
    """What the log has said about one (host, slot) so far."""

    generation: int
    job_id: str
    attempt: int
    leased: bool  # False when the only line seen for this generation is its release
    released: bool


def after_lease(slot: SlotState | None, lease: Lease) -> SlotState:
    """The slot after a ``slot_leased`` or ``slot_released`` line."""
    if slot is not None and lease.generation < slot.generation:
        return slot  # an older generation's line arriving late (skew between merged files)
    if not lease.released:
        return SlotState(lease.generation, lease.job_id, lease.attempt, leased=True, released=False)
    if slot is not None and lease.generation == slot.generation:
        return slot._replace(released=True)
    return SlotState(lease.generation, lease.job_id, lease.attempt, leased=False, released=True)


def judge_apply(slot: SlotState | None, apply: Apply) -> Kind | None:
    """The ownership verdict on one apply; None when it lies inside its owner's lease."""
    if slot is not None and apply.generation < slot.generation:
        return Kind.STALE
    if apply.receipt_job is not None and apply.receipt_job != apply.job_id:
        return Kind.CROSS_JOB
    if slot is None or apply.generation > slot.generation or not slot.leased:
        return Kind.UNOWNED
    if apply.job_id != slot.job_id:
        return Kind.CROSS_JOB
    if apply.attempt != slot.attempt:
        return Kind.WRONG_ATTEMPT
    if slot.released:
        return Kind.AFTER_RELEASE
    return None


class KeySet:
    """Idempotency keys applied so far, as 16-byte blake2b digests (not the keys: smaller)."""

    def __init__(self, digests: Iterable[bytes] = (), *, journal: bool = False) -> None:
        self._seen = set(digests)
        self._fresh: list[bytes] | None = [] if journal else None

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, key: str) -> bool:
        """Record ``key``; True when it had been applied before."""
        digest = blake2b(key.encode(), digest_size=16).digest()
        if digest in self._seen:
            return True
        self._seen.add(digest)
        if self._fresh is not None:
            self._fresh.append(digest)
        return False

    def take_fresh(self) -> list[bytes]:
        """The digests added since the last call (for a caller that persists them)."""
        fresh = self._fresh or []
        if self._fresh is not None:
            self._fresh = []
        return fresh


class Replay:
    """Every (host, slot) timeline and the applied keys: all the state the rules need."""

    def __init__(self, keys: KeySet | None = None) -> None:
        self.slots: dict[tuple[str, str], SlotState] = {}
        self.keys = keys if keys is not None else KeySet()
        self.leases = self.releases = self.applies = 0

    def lease(self, lease: Lease) -> None:
        where = (lease.host, lease.slot_id)
        self.slots[where] = after_lease(self.slots.get(where), lease)
        if lease.released:
            self.releases += 1
        else:
            self.leases += 1

    def judge(self, apply: Apply) -> tuple[Kind, ...]:
        """Every kind this apply is, at most one ownership kind plus duplicate."""
        self.applies += 1
        kind = judge_apply(self.slots.get((apply.host, apply.slot_id)), apply)
        if self.keys.add(apply.key):
            return (Kind.DUPLICATE,) if kind is None else (kind, Kind.DUPLICATE)
        return () if kind is None else (kind,)

    def snapshot(self) -> dict[str, Any]:
        """The timelines and counters as JSON (the key set is persisted by its owner)."""
        return {
            "slots": [[host, slot, *state] for (host, slot), state in self.slots.items()],
            "counts": [self.leases, self.releases, self.applies],
        }

    @classmethod
    def restore(cls, snap: dict[str, Any], keys: KeySet) -> Replay:
        replay = cls(keys)
        for host, slot, *state in snap["slots"]:
            replay.slots[(host, slot)] = SlotState(*state)
        replay.leases, replay.releases, replay.applies = snap["counts"]
        return replay


class Incident(NamedTuple):
    kind: str
    path: str
    line: int
    job_id: str
    slot_id: str
    generation: int
    tool: str
    idempotency_key: str
    host: str
    ts: str

    @classmethod
    def of(cls, kind: Kind, a: Apply) -> Incident:
        return cls(
            str(kind),
            a.path,
            a.line,
            a.job_id,
            a.slot_id,
            a.generation,
            a.tool,
            a.key,
            a.host,
            a.ts,
        )

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @property
    def dedup_key(self) -> str:
        """The incident's identity without its path: a line re-read after rotation is the same."""
        return ":".join(
            (
                self.kind,
                self.host,
                self.slot_id,
                str(self.generation),
                self.job_id,
                self.idempotency_key,
                self.ts,
            )
        )


def judge_records(
    records: Iterable[Record], replay: Replay, kinds: Iterable[Kind] = DETECT_KINDS
) -> Iterator[Incident | Malformed]:
    """Replay records through the timelines; yield incidents of ``kinds`` and malformed lines."""
    wanted = frozenset(kinds)
    for rec in records:
        if type(rec) is Apply:
            for kind in replay.judge(rec):
                if kind in wanted:
                    yield Incident.of(kind, rec)
        elif type(rec) is Lease:
            replay.lease(rec)
        else:
            yield rec  # type: ignore[misc]
