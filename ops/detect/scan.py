"""Read one event log into records, fast: chunks of lines, with C doing the per-line work.

The input is read in chunks of :data:`CHUNK_BYTES` cut at a newline (plain, or gzip
sniffed by its magic so a rotated ``.1.gz`` reads too; ``-`` is stdin). A line is
read as a record only when it can matter (it contains ``"applied"``,
``"slot_leased"`` or ``"slot_released"``); every other line is only checked for the
shape of one JSON object naming an ``"event"``. A line is *malformed* when it fails
that check, or is a candidate that :func:`ops.detect.records.parse_line` refuses. Malformed
lines are counted and reported, never fatal; blank lines are skipped.

Per chunk the common case costs Python nothing per line (:func:`pick`): a regex and a
``contains`` map check every line's shape in C, a regex map picks the candidates,
and (:func:`take`) msgspec decodes them all in one call. Only the records that come
out are touched in Python. When anything in a chunk is off (a malformed or blank
line, a CRLF ending, an overlong line) the chunk takes the line-by-line road
(:func:`scan`), which is the reference: same answers, slower. A candidate of another
event, or one msgspec refuses, sends only the candidates down that road.
``ops.detect.verify`` turns the candidate filter off and parses every line.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import contains, not_
from typing import Any, NamedTuple

import msgspec

from ops.detect.records import (
    AppliedLine,
    Line,
    Malformed,
    Record,
    array_lines,
    as_array,
    decode_array,
    is_apply,
    parse_line,
)
from runner.core.events import OUTCOME_APPLIED, SLOT_LEASED, SLOT_RELEASED

# 1 MiB: per-chunk costs already vanish; bigger chunks only raise the peak RSS (the
# allocator keeps several chunks' worth of freed line objects).
CHUNK_BYTES = 1 << 20
# A "line" this long with no newline is not a log record: counted malformed, skipped,
# never held whole (memory stays constant whatever the input).
MAX_LINE_BYTES = 16 << 20
GZIP_MAGIC = b"\x1f\x8b"
_OVERLONG = b"\x00overlong"  # stands in for a skipped overlong line (no JSON starts so)


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
    return b'"' + text.encode() + b'"'  # as JSON spells a plain name


_CANDIDATE = re.compile(
    b"|".join(re.escape(_mark(name)) for name in (OUTCOME_APPLIED, SLOT_LEASED, SLOT_RELEASED))
).search
_EVENT = _mark("event")
_SHAPE = "not one JSON object naming an event"
# A line that does not end in "}" or does not start with "{" (blank lines, CR, garbage).
_BAD_EDGE = re.compile(rb"\n(?:(?<=[^}]\n)|(?=[^{]))").search


def scan(lines: Iterable[bytes], tally: Tally, *, prefilter: bool = True) -> Iterator[Record]:
    """The records of one stream of lines, one by one; counts go to ``tally`` (line
    numbers continue it). The reference road: :func:`scan_chunk` must agree with it."""
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
                rec: Record = Malformed(path, n, _overlong_or(raw, _SHAPE))
            elif not raw.strip():
                tally.blank += 1
                continue
            else:
                parsed = parse_line(raw, path, n)
                if parsed is None:
                    continue
                rec = parsed
            if type(rec) is Malformed:
                tally.malformed += 1
            yield rec
    finally:
        tally.lines = n


def _overlong_or(raw: bytes, reason: str) -> str:
    return "a line too long to be a log record" if raw == _OVERLONG else reason


class Batch(NamedTuple):
    """What one chunk holds for the rules: finished ``records`` (path and line set,
    non-applies dropped), or ``lines`` decoded straight from the chunk at the line
    ``numbers`` beside them. A consumer of ``lines`` drops the tool_results that are no
    apply (:func:`ops.detect.records.is_apply`) and sets path and line only on what it reports:
    the common line never pays for them."""

    path: str
    records: Sequence[Record] = ()
    lines: Sequence[Line] = ()
    numbers: Sequence[int] = ()


class Picked(NamedTuple):
    """A clean chunk, sorted out in C: its line count and its candidates, as one JSON
    array (:func:`ops.detect.records.as_array`) and their line numbers."""

    lines: int
    array: bytes
    numbers: list[int]


def pick(chunk: bytes, first: int) -> Picked | None:
    """The candidates of a chunk of whole lines whose first line is number ``first``;
    None unless every line ends in a newline and every other line has the shape."""
    if chunk[-1:] != b"\n" or chunk[:1] != b"{" or _BAD_EDGE(chunk) is not None:
        return None
    lines = chunk.split(b"\n")
    lines.pop()  # the empty string after the last newline
    flags = list(map(_CANDIDATE, lines))
    if not all(map(contains, compress(lines, map(not_, flags)), repeat(_EVENT))):
        return None
    numbers = list(compress(count(first), flags))
    return Picked(len(lines), as_array(list(compress(lines, flags))), numbers)


def take(picked: Picked, tally: Tally) -> Batch:
    """Decode what :func:`pick` found; counts go to ``tally``."""
    tally.lines += picked.lines
    try:
        decoded = decode_array(picked.array)
    except msgspec.MsgspecError:  # some candidate is not a record of ours: one by one
        decoded = []
    if len(decoded) == len(picked.numbers):  # not so when a line holds "{...},{...}"
        return Batch(tally.label, lines=decoded, numbers=picked.numbers)
    return Batch(tally.label, _parse_each(array_lines(picked.array), picked.numbers, tally))


def scan_chunk(chunk: bytes, tally: Tally) -> Batch:
    """The records of a chunk of whole lines (each ending in a newline, except maybe a
    last line at the end of the input); counts go to ``tally``."""
    picked = pick(chunk, tally.lines + 1)
    if picked is not None:
        return take(picked, tally)
    return Batch(tally.label, list(scan(chunk_lines(chunk), tally)))


def chunk_lines(chunk: bytes) -> list[bytes]:
    lines = chunk.split(b"\n")
    if chunk[-1:] == b"\n":
        lines.pop()  # the empty string after the last newline
    return lines


def _parse_each(lines: list[bytes], numbers: list[int], tally: Tally) -> list[Record]:
    path, out = tally.label, list[Record]()
    for raw, n in zip(lines, numbers, strict=True):
        rec = parse_line(raw, path, n)
        if rec is not None:
            if type(rec) is Malformed:
                tally.malformed += 1
            out.append(rec)
    return out


def records_of(batch: Batch) -> Sequence[Record]:
    """A batch as finished records, in line order."""
    if not batch.lines:
        return batch.records
    path, out = batch.path, list[Record]()
    for rec, n in zip(batch.lines, batch.numbers, strict=True):
        if type(rec) is AppliedLine and not is_apply(rec):
            continue
        rec.path, rec.line = path, n
        out.append(rec)
    return out


def read_chunks(
    tally: Tally, *, chunk_bytes: int = CHUNK_BYTES, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[bytes]:
    """``tally.path`` in chunks of whole lines. An open or read failure ends the chunks
    and sets ``tally.error``: one bad input never stops the others."""
    raw: Any  # a BufferedReader: peek() sniffs without consuming, even on a pipe
    try:
        raw = sys.stdin.buffer if tally.path == "-" else open(tally.path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        tally.error = "no such file"
        return
    except OSError as exc:
        tally.error = f"cannot read ({exc.strerror or exc})"
        return
    except ValueError:  # open() refuses a path with a NUL before the system sees it
        tally.error = "no such file (the path holds a NUL)"
        return
    # A stdin that is a plain byte stream (a caller running the CLI in-process, as
    # click's test runner does) has no peek(): buffer it, and detach after, so the
    # buffer never closes the caller's stream.
    source = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
    try:
        head = source.peek(2)[:2]
        stream = gzip.GzipFile(fileobj=source, mode="rb") if head == GZIP_MAGIC else source
        yield from _cut(stream, chunk_bytes, max_line_bytes)
    except (OSError, EOFError, zlib.error) as exc:  # a damaged .gz, an I/O error
        tally.error = f"read failed ({exc})"
    finally:
        if source is not raw:
            source.detach()
        if raw is not sys.stdin.buffer:
            raw.close()


def _cut(stream: Any, chunk_bytes: int, max_line_bytes: int) -> Iterator[bytes]:
    """Chunks that end at a newline (the last one maybe not); an overlong line is
    replaced by :data:`_OVERLONG` as it streams past, never held whole."""
    rest, skipping = b"", False
    while data := stream.read(chunk_bytes):
        if skipping:
            end = data.find(b"\n")
            if end < 0:
                continue
            data, skipping = _OVERLONG + data[end:], False
        if rest:
            data = rest + data
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield data if cut == len(data) else data[:cut]
        if len(rest) > max_line_bytes:
            rest, skipping = b"", True
    if skipping:
        yield _OVERLONG
    elif rest:
        yield rest  # a last line without its newline (torn, or still being written)
