"""The fault plan's channel: faults armed and disarmed at run time, a crash taken once."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.testing.faultplan import FaultPlan
from runner.core.durable import DurabilityError, replace_file


def test_eio_holds_only_for_the_armed_directory_and_only_while_armed(tmp_path: Path) -> None:
    """An armed directory's fsyncs fail with EIO (as DurabilityError through durable);
    others, and the same one once disarmed, are real fsyncs."""
    plan = FaultPlan(tmp_path / "faults")
    slot, other = tmp_path / "S1", tmp_path / "S2"
    slot.mkdir()
    other.mkdir()
    plan.arm_fsync_eio(slot)
    with pytest.raises(DurabilityError, match="injected EIO") as failed:
        replace_file(slot / "stamp.json", b"{}\n", fsync=plan.fsync)
    assert failed.value.errno == errno.EIO
    replace_file(other / "stamp.json", b"{}\n", fsync=plan.fsync)
    plan.disarm_fsync_eio(slot)
    replace_file(slot / "stamp.json", b"{}\n", fsync=plan.fsync)
    assert (slot / "stamp.json").read_bytes() == b"{}\n"


def test_a_plan_taking_over_os_fsync_fails_the_armed_directory_only(tmp_path: Path) -> None:
    """In a test worker's process, os.fsync itself obeys the plan, for files and dirs."""
    plan = FaultPlan(tmp_path / "faults")
    armed, free = tmp_path / "attempts", tmp_path / "free"
    armed.mkdir()
    free.mkdir()
    plan.arm_fsync_eio(armed)
    script = f"""
import os, sys
from pathlib import Path
from ops.testing.faultplan import FaultPlan
FaultPlan(Path({str(plan.root)!r})).take_over_os_fsync()
results = []
for path in ({str(armed / "f")!r}, {str(armed)!r}, {str(free / "f")!r}):
    fd = os.open(path, os.O_RDONLY | os.O_CREAT if path.endswith("f") else os.O_RDONLY)
    try:
        os.fsync(fd)
        results.append("ok")
    except OSError as exc:
        results.append(str(exc.errno))
    finally:
        os.close(fd)
print(" ".join(results))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == [str(errno.EIO), str(errno.EIO), "ok"]


def test_a_crash_is_armed_matched_and_consumed_once(tmp_path: Path) -> None:
    """after_effect kills only for a matching call, and removes the crash before killing."""
    root = tmp_path / "faults"
    plan = FaultPlan(root)
    plan.arm_crash(key_contains="job-A:s3:", tool="write_file")
    assert plan.crash_armed()
    plan.after_effect("apply_patch", "job-A:s3:x")  # another tool: nothing
    plan.after_effect("write_file", "job-B:s1:x")  # another key: nothing
    assert plan.crash_armed()
    script = (
        "from pathlib import Path; from ops.testing.faultplan import FaultPlan; "
        f"FaultPlan(Path({str(root)!r})).after_effect('write_file', 'job-A:s3:k'); "
        "print('survived')"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -9 and b"survived" not in done.stdout
    assert not plan.crash_armed()  # consumed: a restarted process does not crash again
    plan.after_effect("write_file", "job-A:s3:k")  # nothing armed: returns
    plan.arm_crash()
    plan.disarm_crash()
    assert not plan.crash_armed()
    assert os.listdir(root / "eio") == []


def test_a_plan_taking_over_os_fsync_fails_a_synced_append_in_the_armed_directory(
    tmp_path: Path,
) -> None:
    """The durable append syncs in its own write (RWF_DSYNC): under a plan that took over
    the process, it fails EIO in the armed directory with its bytes written, as a real
    failed sync leaves them, and succeeds elsewhere."""
    plan = FaultPlan(tmp_path / "faults")
    armed, free = tmp_path / "receipts", tmp_path / "free"
    armed.mkdir()
    free.mkdir()
    (armed / "r.jsonl").touch()  # made before: the append's own write is what fails
    plan.arm_fsync_eio(armed)
    script = f"""
from pathlib import Path
from ops.testing.faultplan import FaultPlan
from runner.core.durable import DurabilityError, append_record
FaultPlan(Path({str(plan.root)!r})).take_over_os_fsync()
results = []
for directory in ({str(armed)!r}, {str(free)!r}):
    try:
        append_record(Path(directory) / "r.jsonl", b"x\\n")
        results.append("ok")
    except DurabilityError as exc:
        results.append(str(exc.errno))
print(" ".join(results))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == [str(errno.EIO), "ok"]
    assert (armed / "r.jsonl").read_bytes() == (free / "r.jsonl").read_bytes() == b"x\n"
