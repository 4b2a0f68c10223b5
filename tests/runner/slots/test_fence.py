"""The runner's own writes to a slot are fenced like tool calls (runner/slots/fence.py, I1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from runner.core import keys
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.slots.fence import LeaseLostError, fenced
from runner.slots.janitor import Janitor
from runner.slots.pool import SlotPool

# A writer that enters the fence, stops itself (as SIGSTOP stops a worker mid-recycle),
# and, once resumed, writes into the tree it believed was still its own.
WRITER = """
import os, signal, sys
from pathlib import Path
from runner.slots.fence import fenced
from runner.core.stamp import read_stamp
slot_dir = Path(sys.argv[1])
stamp = read_stamp(slot_dir)
with fenced(slot_dir, stamp, sys.argv[2], 1):
    (slot_dir / "entered").write_text("")
    os.kill(os.getpid(), signal.SIGSTOP)
    (slot_dir / "work" / "late.txt").write_text("written after the pause\\n")
"""


def _setup(settings: Settings) -> tuple[redis.Redis, SlotPool, Janitor]:
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    log = EventLog(settings)
    pool = SlotPool(settings, client, log)
    return client, pool, Janitor(settings, client, log, pool)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_writer_stopped_inside_the_fence_keeps_the_janitor_out(settings: Settings) -> None:
    client, pool, janitor = _setup(settings)
    job = f"fence-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_attempt(job), 1)
    lease = pool.lease(job, 1)
    slot_dir = settings.slots_dir / lease.slot_id
    (slot_dir / "work").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(slot_dir), job], env=env)
    try:
        # The kernel says when the writer has stopped itself (no polling of /proc).
        _, status = os.waitpid(writer.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"the writer ended instead of stopping: {status:#x}"
        assert (slot_dir / "entered").exists() and _state(writer.pid) == "T"
        client.incr(keys.job_attempt(job))  # a newer attempt fences attempt 1
        # The writer is stopped inside the fence: the slot must not change hands.
        assert janitor.sweep(lock_timeout_s=0.5) == []
        held = read_stamp(slot_dir)
        assert held is not None and held.state == SlotState.LEASED and held.job_id == job
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        writer.wait(timeout=30)
    assert writer.returncode == 0
    # Its late write landed while the slot was still its lease; only now is it reclaimed.
    [reclaimed] = janitor.sweep(lock_timeout_s=5.0)
    assert reclaimed.slot_id == lease.slot_id and reclaimed.generation == lease.generation
    with (
        pytest.raises(LeaseLostError, match="no longer the lease"),
        fenced(slot_dir, lease, job, 1),
    ):
        pass


def test_the_fence_admits_only_the_lease_it_was_given(settings: Settings) -> None:
    client, pool, _ = _setup(settings)
    job = f"fence-{uuid.uuid4().hex[:8]}"
    lease = pool.lease(job, 2)
    slot_dir = settings.slots_dir / lease.slot_id
    with fenced(slot_dir, lease, job, 2) as current:
        assert current == lease
    for other_job, attempt in ((job, 1), ("someone-else", 2)):
        lost = f"is no longer the lease of {other_job} attempt {attempt}"
        with pytest.raises(LeaseLostError, match=lost), fenced(slot_dir, lease, other_job, attempt):
            pass
    pool.release(lease.slot_id, job, lease.generation)
    with pytest.raises(LeaseLostError, match="stamp:"), fenced(slot_dir, lease, job, 2):
        pass
    client.close()
