"""This host's witness of an eval-run's admission desk: the last epoch it saw, on disk.

Redis restarted empty forgets the desk and its epoch with everything else. A process
that starts afterwards would take the re-created desk for a first use and grant
leases next to requests of the lost epoch that are still running in the backend.
The witness file survives the wipe, so the epoch it holds is evidence that a desk
existed before, and the re-created desk starts in its recovery hold
(``runner/admission/desk.py``). :class:`EpochMemory` is what one desk object knows:
the last epoch it saw, and this file.

Layout, inside ``$SLOTRUNNER_HOME``::

    admission/<blake2b-128 of the eval-run, hex>.json   {"eval_run": E, "epoch": "<hex>"}

The file name is a hash, so no eval-run name (they may hold ``/`` or ``..``) can
leave the directory. A file that exists but cannot be read, parsed, or names another
eval-run reads as :data:`UNREADABLE`, which is evidence too: fail closed, because
reading it as "no desk before" is exactly the fail-open the hold prevents. The next
epoch recorded replaces it. Files are never pruned: deleting one reopens the hole.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path

from runner.core.durable import Fsync, ensure_dir, os_fsync, replace_file

WITNESS_DIR = "admission"
# Evidence of a desk whose epoch cannot be told; never equal to a real epoch.
UNREADABLE = "unreadable-witness"

_EPOCH = re.compile(r"[0-9a-f]{1,64}")
# replace_file's temp name is per process: threads of one process take turns.
_WRITING = threading.Lock()


def witness_path(home: Path, eval_run: str, directory: str = WITNESS_DIR) -> Path:
    """``$SLOTRUNNER_HOME/admission/<hash>.json`` for ``eval_run``: always in that directory."""
    digest = hashlib.blake2b(eval_run.encode("utf-8", "surrogatepass"), digest_size=16)
    return home / directory / f"{digest.hexdigest()}.json"


class EpochWitness:
    """The witness file of one eval-run on this host.

    ``directory`` names another directory of the home for another record of the same
    kind: the pool's attempt-number epoch (``runner/worker/liveness.py``) keeps its
    witness in ``attempts-epoch/``, where no eval-run's name can collide with it.
    """

    def __init__(
        self,
        home: Path,
        eval_run: str,
        *,
        directory: str = WITNESS_DIR,
        fsync: Fsync = os_fsync,
    ) -> None:
        self.eval_run = eval_run
        self.path = witness_path(home, eval_run, directory)
        self.fsync = fsync  # the seam a test fails the witness's writes through

    def read(self) -> str | None:
        """The epoch last recorded; None when this host never recorded one;
        :data:`UNREADABLE` when the file is there but says nothing usable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return UNREADABLE
        try:
            record = json.loads(raw)
        except ValueError:
            return UNREADABLE
        if not isinstance(record, dict) or record.get("eval_run") != self.eval_run:
            return UNREADABLE
        epoch = record.get("epoch")
        if not isinstance(epoch, str) or not _EPOCH.fullmatch(epoch):
            return UNREADABLE
        return epoch

    def record(self, epoch: str) -> None:
        """Make ``epoch`` the recorded one, durably.

        Raises ``OSError`` (``DurabilityError`` for a failed fsync): what the file then
        holds is unknown, and the caller must not count on it.
        """
        if not _EPOCH.fullmatch(epoch):
            raise ValueError(f"not a desk epoch: {epoch!r}")
        data = json.dumps({"eval_run": self.eval_run, "epoch": epoch}).encode() + b"\n"
        with _WRITING:
            ensure_dir(self.path.parent, fsync=self.fsync)
            replace_file(self.path, data, fsync=self.fsync)


class EpochMemory:
    """What one desk object knows of its desk's epochs: the last it saw, and its witness.

    ``witness`` is the host's file (None: only this object remembers).
    """

    def __init__(self, witness: EpochWitness | None) -> None:
        self.witness = witness
        self._seen: str | None = None  # the desk's epoch at this object's last call
        self._witnessed: str | None = None  # the epoch the witness file is known to hold

    def evidence(self) -> str:
        """An epoch of this desk seen before ('' when none): a sign a desk existed."""
        if self._seen is not None:
            return self._seen
        if self.witness is None:
            return ""
        recorded = self.witness.read()
        if recorded is not None and recorded != UNREADABLE:
            self._witnessed = recorded
        return recorded or ""

    def saw(self, epoch: str) -> bool:
        """Remember the desk's epoch, and record it in the witness file when it is new
        there; False when that record failed (it is tried again at the next call)."""
        self._seen = epoch
        if self.witness is None or epoch == self._witnessed:
            return True
        try:
            self.witness.record(epoch)
        except (OSError, ValueError):
            return False
        self._witnessed = epoch
        return True
