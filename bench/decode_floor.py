"""The detector's decode floor: read a log as ``ops detect`` does, then drop every record.

    python -m bench.decode_floor PATH

The records come from the detector's own reader, ``ops.detect.inputs.read_batches``
(chunks of whole lines, every line's shape checked and the judged lines picked in C,
those decoded in one msgspec call into the detector's structs, a big file read by a
second process), and nothing is done with them: no rules, no replay state, no output.
No detector over this reader and these structs can go faster, so it is the floor
``bench.detector`` sets the detector's throughput against. Exit 0, or 1 when the log
could not be read.
"""

from __future__ import annotations

import sys

from ops.detect.inputs import read_batches


def main(argv: list[str]) -> int:
    batches, tallies = read_batches(argv)
    decoded = sum(len(batch.lines) + len(batch.records) for batch in batches)
    problems = [t.problem for t in tallies if t.problem is not None]
    if problems or not decoded:
        print(f"decode floor: {problems or 'no record decoded'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
