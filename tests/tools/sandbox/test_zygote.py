"""A zygote (``tools/sandbox/zygote.py``) runs a command as a fresh run would: in its own
pids cgroup from the first instruction, with the call's limits and environment, its
cgroup gone after; one that cannot be used runs nothing. docs/architecture.md §I9."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.sandbox import run as sandbox
from tools.sandbox import zygote
from tools.sandbox.policy import Limits

PROBE = "ulimit -n; ulimit -t; echo $FOO; env | wc -l; sleep 1"


@pytest.fixture
def ready(monkeypatch: pytest.MonkeyPatch) -> Iterator[zygote.Zygote]:
    """A zygote of merged pipes placed in the pool; no other is started meanwhile."""
    monkeypatch.setattr(zygote.POOL, "refill", lambda max_pids, merged: None)
    old = zygote.POOL.take(True)
    if old is not None:
        old.discard()
    made = zygote.spawn(256, True)
    assert made is not None
    zygote.POOL.ready[True] = made
    yield made
    left = zygote.POOL.take(True)
    if left is not None:
        left.discard()


def test_a_zygote_run_is_bound_and_set_like_a_fresh_one(
    ready: zygote.Zygote, tmp_path: Path
) -> None:
    """The waiting zygote is the command, seen from the host while it runs: in its
    cgroup, under this call's pids bound, with its rlimits and only its environment;
    the cgroup is removed after."""
    limits = Limits(processes=8, open_files=77, cpu_s=9, wall_s=30)
    seen: list[tuple[str, list[int]]] = []

    def look() -> None:
        time.sleep(0.5)
        pids = [int(p) for p in ready.cgroup.procs_file.read_text().split()]
        seen.append(((ready.cgroup.path / "pids.max").read_text().strip(), pids))

    watcher = threading.Thread(target=look)
    watcher.start()
    result = sandbox.run(
        ["bash", "-c", PROBE],
        tmp_path,
        mode="required",
        limits=limits,
        env={"FOO": "bar"},
        merged=True,
    )
    watcher.join()
    assert ready.proc.returncode == 0  # the zygote ran it, and was reaped
    assert result.exit_code == 0 and result.stdout.split()[:3] == ["77", "9", "bar"]
    assert int(result.stdout.split()[3]) == len(sandbox.sandbox_env({"FOO": "bar"})) + 3
    ((bound, pids),) = seen
    assert bound == "8" and ready.proc.pid in pids and len(pids) >= 3  # bwrap x2, bash...
    assert not ready.cgroup.path.exists()


def test_a_dead_zygote_runs_nothing_and_the_run_goes_the_ordinary_way(
    ready: zygote.Zygote, tmp_path: Path
) -> None:
    os.killpg(ready.proc.pid, 9)
    ready.proc.wait()
    result = sandbox.run(["bash", "-c", "echo ok"], tmp_path, mode="required", merged=True)
    assert (result.exit_code, result.stdout) == (0, "ok\n")
    assert not ready.cgroup.path.exists()


def test_a_zygote_whose_server_is_gone_exits_126_without_running() -> None:
    """Its stdin closes without the line (the server died): nothing is read or run."""
    made = zygote.spawn(8, True)
    assert made is not None
    marker = f"/tmp/slotrunner-zygote-{os.getpid()}-{time.monotonic_ns()}"
    os.pwrite(made.argv_fd, b"/bin/touch\0" + marker.encode() + b"\0", 0)
    made._close_fds()
    assert made.proc.wait(timeout=10) == 126
    assert not Path(marker).exists()
    made.discard()
    assert not made.cgroup.path.exists()


def test_the_empty_cgroup_of_a_dead_process_is_swept_and_a_live_one_kept() -> None:
    """What a killed server's zygote leaves (an empty cgroup named by a pid no longer
    running) is removed; a live process's cgroup is not."""
    from tools.sandbox.cgroup import PidsCgroup, sweep_dead

    mine = PidsCgroup.create(8)
    assert mine is not None
    dead = mine.path.with_name(f"slotrunner-{_dead_pid()}-{os.urandom(6).hex()}")
    dead.mkdir()
    try:
        assert sweep_dead() >= 1
        assert not dead.exists() and mine.path.exists()
    finally:
        if dead.exists():
            dead.rmdir()
        mine.remove()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not Path(f"/proc/{proc.pid}").exists()
    return proc.pid
