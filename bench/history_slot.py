"""A slot with a history, built the way a host builds one: the real pool, the real store.

Each generation of the build is one lease of the slot (``runner.slots.pool.SlotPool``),
``RECORDS_PER_GENERATION`` receipt records for it (``ReceiptStore.begin`` + ``finish``,
keys like ``job-7:a1:s12:write_file``, one job per generation), then the release. So
whatever the pool and the store do at a lease, a release or a record (rotating old
generations out of the hot file, say) happens to the built slot as it would on a host.

The build is not what is measured, so it is made as cheap as those public APIs allow:
the store is given a no-op ``fsync`` (a million records would otherwise wait on a
million fsyncs), and one store writes the whole build, as the tool server keeps one
store per slot (``tools.server.receipts``): a store opened anew reads the hot file from
its start, so a store per generation would read the history once per generation. The
pool itself has no fsync seam: its stamps and token records are fsynced for real.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.fixtures import settings_for
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import Lease, SlotPool
from runner.workspace.tree import WORK_DIR
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore, Status

RECORDS_PER_GENERATION = 100  # 50 begin + finish pairs: one job's calls
PROGRESS_EVERY_S = 15.0
_DIGEST = "0" * 64


def _no_fsync(fd: int, directory: str) -> None:
    """The build's fsync: none (the build is set-up, not a measurement)."""


def build_key(job_id: str, step: int) -> str:
    return f"{job_id}:a1:s{step}:write_file"


@dataclass(frozen=True)
class Disk:
    """What the slot keeps on disk: the hot receipt file and everything outside ``work/``
    (the hot file, the store's archive if it has one, the stamp, token records, locks)."""

    hot_bytes: int
    kept_bytes: int


@dataclass
class SlotHistory:
    """One host (a home with one slot, S0) whose slot grows a history of leases."""

    settings: Settings
    redis: redis.Redis
    pool: SlotPool
    generations: int = 0  # leases taken, built and measured
    records: int = 0  # receipt records written, built and measured
    oldest_key: str | None = None  # the first key this slot ever recorded
    _store: ReceiptStore | None = field(default=None, repr=False)

    @classmethod
    def open(cls, home: Path, redis_url: str, name: str) -> SlotHistory:
        # The sandbox is off: no call here needs it, and its self-test at start-up
        # would add a bwrap run to every start time measured.
        settings = settings_for(home, redis_url, sandbox="off", name=name)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        return cls(settings, client, SlotPool(settings, client, EventLog(settings)))

    @property
    def slot_dir(self) -> Path:
        return self.settings.slots_dir / "S0"

    def lease(self, job_id: str) -> Lease:
        lease = self.pool.lease(job_id, 1, wait_s=5.0)
        self.generations += 1
        return lease

    def release(self, lease: Lease) -> None:
        assert lease.job_id is not None
        self.pool.release(lease.slot_id, lease.job_id, lease.generation)

    def wrote(self, records: int, first_key: str) -> None:
        """Count records another writer (the tool server) made for this slot."""
        self.records += records
        if self.oldest_key is None:
            self.oldest_key = first_key

    def grow(self, records: int, progress: Callable[[str], None]) -> float:
        """Lease, record and release until the slot holds ``records`` records; seconds."""
        started = last = time.monotonic()
        todo = max(0, records - self.records)
        while self.records < records:
            self._generation()
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                done = todo - (records - self.records)
                progress(f"{done:,} of {todo:,} records ({now - started:.0f}s)")
        return time.monotonic() - started

    def _generation(self) -> None:
        lease = self.lease(f"job-{self.generations + 1}")  # one job per generation
        assert lease.job_id is not None
        if self._store is None:
            self._store = ReceiptStore(self.slot_dir, fsync=_no_fsync)
        for step in range(RECORDS_PER_GENERATION // 2):
            key = build_key(lease.job_id, step)
            began = self._store.begin(
                key=key,
                job_id=lease.job_id,
                attempt=1,
                slot_id=lease.slot_id,
                generation=lease.generation,
                tool="write_file",
                relpath=f"src/module_{step}.py",
                digest=_DIGEST,
                pre_digest=_DIGEST,
            )
            self._store.finish(began.receipt, Status.APPLIED, digest=_DIGEST, result={"bytes": 120})
            self.wrote(2, key)
        self.release(lease)

    def disk(self) -> Disk:
        hot = self.slot_dir / RECEIPTS_FILE
        kept = 0
        for root, dirs, files in os.walk(self.slot_dir):
            if Path(root) == self.slot_dir and WORK_DIR in dirs:
                dirs.remove(WORK_DIR)  # the job's tree, not the slot's records
            kept += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
        return Disk(hot.stat().st_size if hot.exists() else 0, kept)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self.redis.close()
