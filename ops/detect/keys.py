"""The idempotency keys applied so far: the one part of the detector's state that grows.

"Applied at most once, ever" needs every applied key remembered. A Python set of
16-byte digests costs 83 bytes a key (the object and the set's slot); a million keys,
a few GB of log, would alone break a 100 MB budget. So the keys are kept as 8-byte
fingerprints in an open-addressing table (an ``array`` of int64, double hashing):
13 to 27 bytes a key with the table's slack (load kept between 0.3 and 0.6).

Two distinct keys share a fingerprint with odds about n**2 / 2**65 (1e-7 for a million
keys): that would be a false ``duplicate_apply``, never a missed one.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable
from contextlib import suppress
from typing import Protocol

from ops.detect.scan import Tally

BYTES_PER_KEY = 900  # real traffic writes one applied key per 850 to 950 bytes of log
MAX_EXPECTED_KEYS = 2_500_000  # sizing ahead stops at a 32 MB table; past it, grow


class AppliedKeys(Protocol):
    """What the rules need of a key set: this one, or ``ops.detect.keystore.KeyStore``."""

    def add(self, key: str) -> bool: ...

    def __len__(self) -> int: ...


class KeySet:
    """Idempotency keys applied so far, as 8-byte fingerprints in memory (a one-shot run).

    The fingerprint is Python's own string hash (seeded per process, and already
    computed). ``ops detect --follow`` keeps its keys on disk instead
    (``ops.detect.keystore``): it never ends, so nothing of it may grow in memory.
    """

    MAX_LOAD = 0.6

    def __init__(self, *, expected: int = 0) -> None:
        self._table, self._n = array("q"), 0
        self._resize(expected)

    def __len__(self) -> int:
        return self._n

    def add(self, key: str) -> bool:
        """Record ``key``; True when it had been applied before (the hot loop's one call
        a key: the probe is written out here, not in a helper)."""
        fp = hash(key) or 1  # 0 marks an empty cell
        table, mask = self._table, self._mask
        i = fp & mask
        step = (fp >> 32) | 1  # double hashing: no primary clusters near the load limit
        while (cell := table[i]) != 0:
            if cell == fp:
                return True
            i = (i + step) & mask
        table[i] = fp
        self._n += 1
        if self._n > self._limit:
            self._resize(self._n)
        return False

    def _resize(self, keys: int) -> None:
        """A table that holds ``keys`` under the load limit, with the old cells moved in
        (each is distinct: only its free cell is looked for)."""
        cells = 1 << max(16, int(keys / self.MAX_LOAD).bit_length())
        old = self._table
        # array * n fills in place: no temporary zero buffer doubling the peak
        table = self._table = array("q", [0]) * cells
        mask = self._mask = cells - 1
        self._limit = int(cells * self.MAX_LOAD)
        moved = 0
        for fp in filter(None, old):
            i, step = fp & mask, (fp >> 32) | 1
            while table[i]:
                i = (i + step) & mask
            table[i] = fp
            moved += 1
        self._n = moved


def expected_keys(tallies: Iterable[Tally]) -> int:
    """A guess of the distinct applied keys in these inputs, to size the key table once
    instead of growing it (each growth re-inserts every key in Python)."""
    total = 0
    for tally in tallies:
        with suppress(OSError):
            total += 0 if tally.path == "-" else os.path.getsize(tally.path)
    return min(total // BYTES_PER_KEY, MAX_EXPECTED_KEYS)
