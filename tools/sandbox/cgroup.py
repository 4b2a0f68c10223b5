"""A fresh pids cgroup for one sandboxed run: the process bound that also holds for root.

``RLIMIT_NPROC`` is not enforced for root, so a writable pids cgroup (v1 or v2) is
what bounds a fork bomb there; it also finds every descendant to kill, including
one that left the process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

from runner.core.poll import PollTimeout, poll_until

# How long a kill may take to empty the cgroup; tools/sandbox/process.py drains pipes as long.
GRACE_S = 5.0
# How often an emptying cgroup is looked at: the kernel reaps a killed process within
# a millisecond or so, and every call waits for it before its reply.
POLL_S = 0.001


class PidsCgroup:
    """A fresh pids cgroup (v1 or v2) for one run: bounds and finds every descendant."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        for parent in _pids_parents():
            child = parent / f"slotrunner-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            try:
                child.mkdir()
            except OSError:
                continue
            try:
                (child / "pids.max").write_text(str(max_pids))
                return cls(child)
            except OSError:
                with contextlib.suppress(OSError):
                    child.rmdir()
        return None

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        def emptied() -> bool:
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not pids  # processes leave the cgroup once the kernel reaps them

        with contextlib.suppress(PollTimeout):
            poll_until(emptied, GRACE_S, POLL_S)

    def remove(self) -> None:
        def removed() -> bool:
            try:
                self.path.rmdir()
                return True
            except OSError:
                self.kill_all()
                return False

        with contextlib.suppress(PollTimeout):  # left for an operator; its name says whose
            poll_until(removed, GRACE_S, POLL_S)


def sweep_dead() -> int:
    """Remove the empty cgroups of slotrunner processes that are gone (a server killed
    while a zygote waited or a run went on leaves its cgroup behind); how many.

    Only an empty cgroup can be removed, and only one whose creator's pid is not
    running is tried, so a live run's is never touched."""
    removed = 0
    for parent in _pids_parents():
        try:
            children = list(parent.glob("slotrunner-*-*"))
        except OSError:
            continue
        for child in children:
            owner = child.name.split("-")[1]
            if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            with contextlib.suppress(OSError):
                child.rmdir()
                removed += 1
    return removed


def _pids_parents() -> list[Path]:
    """Where this process may create a pids cgroup: v1 pids hierarchy, else v2."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    own: dict[str, str] = {}
    for line in membership:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        own[controllers] = path
    found: list[Path] = []
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup" and "pids" in options:
            rel = next((p for c, p in own.items() if "pids" in c.split(",")), "/")
        elif fstype == "cgroup2":
            rel = own.get("", "/")
        else:
            continue
        for base in (point / rel.lstrip("/"), point):
            if fstype == "cgroup2" and "pids" not in _read(base / "cgroup.subtree_control"):
                continue  # a v2 child gets pids.max only if its parent delegates pids
            if base.is_dir() and base not in found:
                found.append(base)
    return found


def _read(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []
