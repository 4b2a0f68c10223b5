"""ops.detect.prefetch: a second process reads a file exactly as the caller would."""

from __future__ import annotations

import gzip
import multiprocessing.util
import os
from pathlib import Path

from ops.detect import prefetch
from ops.detect.scan import Tally, read_chunks, records_of, scan_chunk
from ops.testing.synthlog import synth_log
from tests.support.detectlog import lease_line


def _in_process(path: Path) -> tuple[list[tuple[str, int, str]], Tally]:
    tally = Tally(str(path))
    recs = [r for c in read_chunks(tally) for r in records_of(scan_chunk(c, tally))]
    return [(type(r).__name__, r.line, r.ts) for r in recs], tally


def _prefetched(path: Path) -> tuple[list[tuple[str, int, str]], Tally]:
    tally = Tally(str(path))
    recs = [r for b in prefetch.batches(tally) for r in records_of(b)]
    return [(type(r).__name__, r.line, r.ts) for r in recs], tally


def _counts(tally: Tally) -> tuple[int, int, int, str | None]:
    return (tally.lines, tally.blank, tally.malformed, tally.error)


def test_the_reading_process_finds_what_the_caller_finds(tmp_path: Path) -> None:
    """Same records, malformed lines, numbers and counts, plain or gzip, garbage included."""
    path = tmp_path / "log.jsonl"
    synth_log(path, 30_000, seed=12)  # about 9 MB: several chunks, some with garbage
    gz = tmp_path / "log.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    want, ref = _in_process(path)
    for source in (path, gz):
        found, tally = _prefetched(source)
        assert found == want
        assert _counts(tally) == _counts(ref)
    assert ref.malformed > 0


def test_unusable_input_is_reported_not_raised(tmp_path: Path) -> None:
    """A missing file or a damaged gzip sets the tally's error, as reading in-process does."""
    tally = Tally(str(tmp_path / "missing.jsonl"))
    assert list(prefetch.batches(tally)) == [] and tally.error == "no such file"
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(lease_line("A", 1) * 5_000)[:-40])
    tally = Tally(str(bad))
    list(prefetch.batches(tally))
    assert tally.error is not None and tally.error.startswith("read failed")


def _children() -> set[int]:
    pid = os.getpid()
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_stopping_early_ends_the_reading_process(tmp_path: Path) -> None:
    """A caller that stops after one batch leaves no reading process behind."""
    path = tmp_path / "log.jsonl"
    path.write_bytes((lease_line("A", 1) + b"\n") * 200_000)
    before = _children()
    found = prefetch.batches(Tally(str(path)))
    assert next(found).lines
    assert len(_children() - before) == 1  # the reader is there while the caller reads
    found.close()
    assert _children() == before


class _Library:
    """Something a library keeps that it cleans up in forked workers (as kombu's pools)."""


def test_after_fork_handlers_of_libraries_do_not_run_in_the_reader(tmp_path: Path) -> None:
    """The reader is not a multiprocessing worker: a library's after-fork handler stays out.

    kombu registers one that closes the caller's pooled broker connections; one waiting
    in BRPOP never answered, and the reader hung before it read a byte. The handler
    here leaves the child at once instead, so running it would show as a dead reader.
    """
    path = tmp_path / "log.jsonl"
    synth_log(path, 2_000, seed=3)
    want, _ = _in_process(path)
    library = _Library()
    multiprocessing.util.register_after_fork(library, lambda _: os._exit(7))
    try:
        found, tally = _prefetched(path)
    finally:
        del library  # the registry holds it weakly: gone, it is never called again
    assert tally.error is None
    assert found == want
