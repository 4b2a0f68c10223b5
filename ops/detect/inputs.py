"""Which inputs a detector run reads, and in what order their records reach the rules.

Paths are files (plain or gzip), globs (expanded, sorted; one matching nothing is kept
so that it is reported missing) or ``-`` for stdin. One input is replayed in line
order, which is the write order (one ``O_APPEND`` write per line), batch by batch as
:mod:`ops.detect.scan` reads it (a big one by a second process: :mod:`ops.detect.prefetch`).
Several are merged by ``ts`` (``heapq.merge`` over per-file streams, each assumed
roughly ordered), record by record.
"""

from __future__ import annotations

import glob
import heapq
import os
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import chain, count, islice, takewhile

from ops.detect import prefetch
from ops.detect.records import Record
from ops.detect.scan import Batch, Tally, chunk_lines, read_chunks, records_of, scan, scan_chunk

BATCH_RECORDS = 4096  # records per batch when several inputs are merged record by record


def expand(paths: Sequence[str]) -> list[str]:
    """Paths with globs expanded (sorted); ``-`` is stdin. A glob matching nothing is kept.

    A file named twice (``logs/*.jsonl logs/a.jsonl``, a symlink beside its target) is
    read once: read twice, each of its applies would be a false ``duplicate_apply``."""
    out: list[str] = []
    seen: set[object] = set()
    for path in paths:
        matches = sorted(glob.glob(path)) if glob.has_magic(path) and path != "-" else []
        for found in matches or [path]:
            if (same := _identity(found)) not in seen:
                seen.add(same)
                out.append(found)
    return out


def _identity(path: str) -> object:
    """The file behind ``path``: its inode when it can be stat'ed, else the path itself."""
    if path == "-":
        return path
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, unreadable, a NUL: reported when opened
        return os.path.abspath(path)
    return (st.st_dev, st.st_ino)


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


def batches(tally: Tally, *, prefilter: bool = True, alone: bool = False) -> Iterator[Batch]:
    """One input, a batch per chunk, in line order. An input read ``alone`` (the only
    one) may be read by a second process; several at once never are: a process per
    rotated file of a glob would be many processes at the same time."""
    if not prefilter:
        return (_one_by_one_all(chunk, tally) for chunk in read_chunks(tally))
    if alone and prefetch.worth_it(tally):
        return prefetch.batches(tally)
    return (scan_chunk(chunk, tally) for chunk in read_chunks(tally))


def _one_by_one_all(chunk: bytes, tally: Tally) -> Batch:
    return Batch(tally.label, list(scan(chunk_lines(chunk), tally, prefilter=False)))


def read_batches(
    paths: Sequence[str], *, prefilter: bool = True
) -> tuple[Iterator[Batch], list[Tally]]:
    """The records of every input in batches, merged by ``ts``; one tally per input.

    One input keeps its chunks' batches (line order is write order); several are merged
    record by record, then cut into batches again."""
    tallies = [Tally(path) for path in expand(paths)]
    if len(tallies) == 1:
        return batches(tallies[0], prefilter=prefilter, alone=True), tallies
    streams = [
        chain.from_iterable(map(records_of, batches(tally, prefilter=prefilter)))
        for tally in tallies
    ]
    merged = merge_by_ts(streams)
    cut = (Batch("", list(islice(merged, BATCH_RECORDS))) for _ in count())
    return takewhile(lambda batch: bool(batch.records), cut), tallies


def read_records(
    paths: Sequence[str], *, prefilter: bool = True
) -> tuple[Iterator[Record], list[Tally]]:
    """The records of every input, merged by ``ts``, and one tally per input."""
    found, tallies = read_batches(paths, prefilter=prefilter)
    return chain.from_iterable(map(records_of, found)), tallies
