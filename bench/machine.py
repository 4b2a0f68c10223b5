"""What machine a run was on, and how much memory its processes peaked at.

Peak memory is read from ``/proc/<pid>/status`` (``VmHWM``, the resident high-water
mark) while the process is alive, or from ``wait4`` (``ru_maxrss``) when a child is
reaped: no psutil needed, and exact for one process rather than for all children.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_KIB_PER_MB = 1024.0


def _version(argv: Sequence[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if text else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict[str, Any]:
    """The facts RESULTS.md records about the machine and the tools it used."""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "memory_total_mb": _mem_total_mb(),
        "git": _version(["git", "--version"]),
        "jq": _version(["jq", "--version"]),
        "bwrap": _version(["bwrap", "--version"]),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_ticks_at_start": cpu_ticks(),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }


def cpu_ticks() -> list[int] | None:
    """The host's CPU time counters since boot (``/proc/stat``'s first line: user .. steal)."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None


def steal_share(start: list[int] | None, end: list[int] | None) -> float | None:
    """Of the host's CPU time between two readings, the share the hypervisor gave to
    other guests (``steal``): on a shared virtual machine, a run whose share is high
    measured through a noisy neighbour, and its ratios drift more than its spreads say."""
    if not start or not end or len(start) < 8 or len(end) < 8:
        return None
    total = sum(end) - sum(start)
    return round((end[7] - start[7]) / total, 4) if total > 0 else None


class _FixedWork:
    """The same few µs of interpreter work each call, over a working set the size of a
    small service's: 300 tuples read at scattered places among 20,000."""

    def __init__(self) -> None:
        self.rows = [(i, str(i)) for i in range(20_000)]
        self.picks = random.Random(0).sample(range(len(self.rows)), 300)

    def __call__(self) -> int:
        return sum(self.rows[i][0] for i in self.picks)


def _median_us(work: _FixedWork, rounds: int, before: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        before()
        start = time.perf_counter_ns()
        work()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def cpu_after_sync(directory: Path, rounds: int = 300) -> dict[str, float]:
    """How much slower this host runs Python on a CPU just back from a synced write.

    The same work (:class:`_FixedWork`) is timed in a busy loop, the CPU never idle,
    and right after each of ``rounds`` small writes synced to a file in ``directory``
    (``RWF_DSYNC``, the receipt store's primitive), during which the CPU went idle.
    Medians in µs, and their ratio. Hosts differ here by 2-3x, and the figures whose
    Python runs between syncs (``receipts.one_writer``, ``receipts.eight_slots``) move
    with it: this is the fact that lets two runs' figures be set side by side.
    """
    work = _FixedWork()
    _median_us(work, 50, lambda: None)  # warm-up: the first calls pay for the rows' pages
    busy_us = _median_us(work, rounds, lambda: None)
    path = directory / "cpu-after-sync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        after_us = _median_us(work, rounds, lambda: os.pwritev(fd, (b"x" * 64,), -1, os.RWF_DSYNC))
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {
        "busy_us": round(busy_us, 2),
        "after_sync_us": round(after_us, 2),
        "ratio": round(after_us / busy_us, 2),
    }


def _mem_total_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / _KIB_PER_MB, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def vm_hwm_mb(pid: int) -> float | None:
    """Peak resident memory of a live process in MB, or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / _KIB_PER_MB, 2)
    except (OSError, ValueError, IndexError):
        return None
    return None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from ``/proc/*/stat``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return sorted(found)


def tree_hwm_mb(pid: int) -> tuple[float, list[float]]:
    """(sum, per process) of the peak RSS of ``pid`` and its direct children."""
    peaks = [p for p in (vm_hwm_mb(q) for q in [pid, *children(pid)]) if p is not None]
    return round(sum(peaks), 2), peaks


# Measures the peak RSS of one command from a small parent. wait4 straight from the
# benchmark process would not do: Linux carries the parent's high-water mark into the
# child's ru_maxrss across fork+exec, so every child would seem as large as the parent.
_SHIM = """\
import os, sys
pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("peak_rss_kib=%d\\n" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def run_peak_rss(argv: Sequence[str], **popen: Any) -> tuple[int, float, float]:
    """Run ``argv`` to the end: (exit status, wall seconds, peak RSS of it in MB).

    ``/usr/bin/time`` measures when it is installed; otherwise a minimal Python parent
    does (its own few MB are then a floor under the figure).
    """
    import tempfile
    import time

    with tempfile.NamedTemporaryFile("r", suffix=".rss") as out:
        if os.access("/usr/bin/time", os.X_OK):
            command = ["/usr/bin/time", "-f", "peak_rss_kib=%M", "-o", out.name, *argv]
        else:
            command = [sys.executable, "-I", "-S", "-c", _SHIM, *argv]
            popen = {**popen, "stderr": open(out.name, "w")}  # noqa: SIM115 - closed below
        start = time.perf_counter()
        try:
            code = subprocess.run(command, check=False, **popen).returncode
        finally:
            if command[0] == sys.executable:
                popen["stderr"].close()
        wall = time.perf_counter() - start
        found = [ln for ln in Path(out.name).read_text().splitlines() if "peak_rss_kib=" in ln]
    if not found:
        raise RuntimeError(f"no peak RSS reported for {argv[0]} (exit {code})")
    return code, wall, round(int(found[-1].split("=", 1)[1]) / _KIB_PER_MB, 2)
