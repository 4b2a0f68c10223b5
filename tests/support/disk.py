"""A disk whose fsync fails when told to: the ``fsync`` seam of ``runner.core.durable``.

Built into the writer under test (``ReceiptStore(slot, fsync=disk.fsync)``), so the
failure is the one a real EIO gives, with no marker file and no patching of ``os``.
"""

from __future__ import annotations

import errno
import os


class Disk:
    """Counts the fsyncs it is asked for; while ``failing``, each one fails with EIO."""

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.calls: list[str] = []  # the directory of each fsync asked for

    def fsync(self, fd: int, directory: str) -> None:
        self.calls.append(directory)
        if self.failing:
            raise OSError(errno.EIO, f"injected EIO on fsync in {directory}")
        os.fsync(fd)
