"""The host's environments: held by running jobs, listed, removed and evicted LRU
(runner/envs/store.py).

A hold is an ``flock`` of the job's worker process: the tests take it in a real child
process and kill that process with SIGKILL, as a worker dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.envs.store import RELEASE_GRACE_S, EnvBusy, EnvError, EnvStore
from tests.support.repos import REPO

MiB = 1024 * 1024

HOLD = """
import sys
from pathlib import Path
from runner.envs.store import EnvStore
held = EnvStore(Path(sys.argv[1])).hold(sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def ready(store: EnvStore, key: str, size: int, last_used: float) -> None:
    """A good environment of ``size`` bytes, last used at ``last_used``."""
    env = store.reset(key)
    (env / "blob").write_bytes(os.urandom(size))
    store.mark_ready(key, {"key": key, "size_bytes": size, "build_s": 1.5, "repo": "r"})
    (store.root(key) / "last_used").touch()
    os.utime(store.root(key) / "last_used", (last_used, last_used))


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []
    yield children
    for child in children:
        child.kill()
        child.wait()


def hold_in_child(
    children: list[subprocess.Popen[str]], home: Path, key: str
) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home), key],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    children.append(child)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_an_environment_held_by_a_live_process_is_not_removed_until_that_process_dies(
    tmp_path: Path, holder: list[subprocess.Popen[str]]
) -> None:
    store = EnvStore(tmp_path)
    key = "a" * 24
    ready(store, key, MiB, 1000.0)
    child = hold_in_child(holder, tmp_path, key)
    assert store.info(key).in_use
    with pytest.raises(EnvBusy, match=f"environment {key} is being built or used"):
        store.remove(key)
    assert store.meta(key) is not None and (store.env_dir(key) / "blob").exists()
    child.kill()  # a worker that dies drops its hold with its file descriptors
    child.wait()
    assert not store.info(key).in_use
    store.remove(key)
    assert store.keys() == [] and not store.root(key).exists()


def test_a_removal_just_after_a_hold_is_let_go_waits_out_a_forked_childs_copy(
    tmp_path: Path,
) -> None:
    """A holder's process forks (a thread starting a zygote does) while its hold is
    open: the child shares the flock until it execs or exits. The holder lets go, and
    a removal made at that instant waits for the child's copy to go instead of
    refusing an environment nobody uses; one still held past the wait is refused."""
    store = EnvStore(tmp_path)
    key = "d" * 24
    ready(store, key, MiB, 1000.0)
    hold = store.hold(key)
    pid = os.fork()
    if pid == 0:  # the fork's window, stretched: the child keeps the copy a moment
        time.sleep(0.2)
        os._exit(0)
    try:
        hold.close()
        assert store.info(key).in_use  # the child's copy still holds it
        store.remove(key)  # not refused: the copy goes within the grace
    finally:
        os.waitpid(pid, 0)
    assert store.keys() == [] and not store.root(key).exists()

    ready(store, key, MiB, 1000.0)
    hold = store.hold(key)
    pid = os.fork()
    if pid == 0:  # a copy kept longer than the grace: the environment reads as in use
        time.sleep(RELEASE_GRACE_S * 4)
        os._exit(0)
    try:
        hold.close()
        with pytest.raises(EnvBusy):
            store.remove(key)
    finally:
        os.waitpid(pid, 0)
    store.remove(key)
    assert store.keys() == []


def test_eviction_removes_the_least_recently_used_until_the_rest_fit_never_one_in_use(
    tmp_path: Path, holder: list[subprocess.Popen[str]]
) -> None:
    store = EnvStore(tmp_path, max_bytes=int(2.5 * MiB))
    oldest, middle, newest = "1" * 24, "2" * 24, "3" * 24
    for key, used in ((oldest, 100.0), (middle, 200.0), (newest, 300.0)):
        ready(store, key, MiB, used)
    hold_in_child(holder, tmp_path, oldest)
    assert store.evict() == [middle]  # the oldest is in use: the next one goes
    assert store.keys() == [oldest, newest]
    store.max_bytes = MiB // 2
    assert store.evict(keep=frozenset({newest})) == []  # in use, kept: over the bound
    assert store.keys() == [oldest, newest]


def test_listing_shows_state_size_and_last_use(tmp_path: Path) -> None:
    store = EnvStore(tmp_path)
    good, failed = "b" * 24, "c" * 24
    ready(store, good, MiB, 1234.0)
    store.reset(failed)
    store.mark_failed(failed, {"key": failed, "error": "environment setup failed: step 1/1"})
    rows = {info.key: info.as_json() for info in store.all()}
    assert rows[good]["state"] == "ready" and rows[good]["size_bytes"] == MiB
    assert rows[good]["last_used"] == 1234.0 and rows[good]["build_s"] == 1.5
    assert rows[failed]["state"] == "failed"
    assert rows[failed]["error"].startswith("environment setup failed")


def test_a_key_of_another_shape_names_nothing(tmp_path: Path) -> None:
    store = EnvStore(tmp_path)
    for key in ("../../etc", "A" * 24, "a" * 23, ""):
        with pytest.raises(EnvError, match="is not an environment key"):
            store.root(key)
    with pytest.raises(EnvError, match="no environment"):
        store.remove("d" * 24)
