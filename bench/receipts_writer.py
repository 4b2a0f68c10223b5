"""One receipt store writer: the loop every store arm of ``bench.receipts`` times.

Also a process of its own for the ``receipts.eight_processes`` arm::

    python -m bench.receipts_writer SLOT_DIR PAIRS TAG

It imports the store and nothing else of the benchmark suite, prints ``ready``, waits
for a line on its stdin (the start every writer is released by at once), writes
``PAIRS`` begin+finish pairs and prints the duration of each record's call as one JSON
list. Why a fresh interpreter: ``bench.receipts._processes``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tools.receipts.store import ReceiptStore, Status

READY = "ready"


def store_writer(slot_dir: Path, pairs: int, tag: str, pause: float = 0.0) -> list[float]:
    """``pairs`` begin+finish pairs; the duration of each record's call. With ``pause``,
    the writer sleeps that long (untimed) before each record, as it waits for a device."""
    store = ReceiptStore(slot_dir)
    durations: list[float] = []
    for i in range(pairs):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        began = store.begin(
            key=f"{tag}:k{i}",
            job_id=f"job-{tag}",
            attempt=1,
            slot_id=slot_dir.name,
            generation=7,
            tool="write_file",
            relpath=f"src/module_{i % 50}.py",
            digest="0" * 64,
            pre_digest="1" * 64,
        )
        mid = time.perf_counter()
        if pause:
            time.sleep(pause)
            mid = time.perf_counter()
        store.finish(began.receipt, Status.APPLIED, digest="0" * 64, result={"bytes": 120})
        end = time.perf_counter()
        durations += [mid - start, end - mid]
    return durations


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit():
        print("usage: python -m bench.receipts_writer SLOT_DIR PAIRS TAG", file=sys.stderr)
        return 2
    slot_dir, pairs, tag = Path(argv[0]), int(argv[1]), argv[2]
    print(READY, flush=True)
    if not sys.stdin.readline():  # the parent went away before the start
        return 1
    try:
        durations = store_writer(slot_dir, pairs, tag)
    except Exception as exc:  # one line for the parent's error, not a traceback
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(durations), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
