"""Nothing an exec starts outlives its call, and nothing it does reaches past its slot's
tree: hostile commands on a real tool server under the real bwrap, checked from the
host (/proc, the host's files, a listening socket). docs/architecture.md §Exec tool.

The slotrunner home lies under /var/tmp, outside the sandbox's private /tmp, so it is
hiding ``$SLOTRUNNER_HOME`` that keeps it out of sight, as on a real host.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runner.core.settings import Settings
from tests.support.execslots import Slots, procs_with, run
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer


@dataclass
class Host:
    server: ToolServer
    slots: Slots


def start(settings: Settings, tmp_path: Path, home: Path, mode: str) -> Host:
    server = ToolServer(settings.with_(home=home, sandbox=mode), tmp_path / f"logs-{mode}")
    repo = tmp_path / f"repo-{mode}"
    return Host(server, Slots(server.settings, repo, make_repo(repo)))


@pytest.fixture
def homes() -> Iterator[list[Path]]:
    made: list[Path] = []
    try:
        yield made
    finally:
        for home in made:
            shutil.rmtree(home, ignore_errors=True)


def new_home(homes: list[Path]) -> Path:
    homes.append(Path(tempfile.mkdtemp(prefix="slotrunner-exec-", dir="/var/tmp")))
    return homes[-1]


@pytest.fixture
def host(settings: Settings, tmp_path: Path, homes: list[Path]) -> Iterator[Host]:
    found = start(settings, tmp_path, new_home(homes), "required")
    try:
        yield found
    finally:
        found.server.stop()
        found.slots.close()


def unique_sleep() -> str:
    """A sleep duration no other process on the host has: it marks this test's processes."""
    return f"1.{uuid.uuid4().int % 10**8:08d}"


def leavers(d: str) -> str:
    """Four ways to leave a process behind, each writing a file after ``d`` seconds."""
    return (
        f"( sleep {d}; echo bg > f1 ) & "
        f"nohup bash -c 'sleep {d}; echo nohup > f2' >/dev/null 2>&1 & "
        f"setsid bash -c 'sleep {d}; echo setsid > f3' & "
        f"( ( sleep {d}; echo double > f4 ) & ) ; "
    )


@pytest.mark.parametrize("mode", ["required", "off"])
def test_background_processes_are_dead_before_the_reply(
    settings: Settings, tmp_path: Path, homes: list[Path], mode: str
) -> None:
    """A background job, nohup, setsid and a double fork: the command returns at once,
    none of them is alive when the reply arrives, and none writes its file later.
    With the sandbox off the process group and the pids cgroup do it."""
    found = start(settings, tmp_path, new_home(homes), mode)
    try:
        stamp = found.slots.lease("job-A")
        d = unique_sleep()
        response = run(found.server.url, stamp, "job-A:bg", {"command": leavers(d) + "echo ok"})
        result = response.json()["result"]
        assert (result["exit_code"], result["output"], result["timed_out"]) == (0, "ok\n", False)
        assert result["sandbox"] == ("bwrap" if mode == "required" else "none")
        assert procs_with(d) == []  # checked from the host, right after the reply
        time.sleep(float(d) + 1.0)  # past every planted write: nothing is there to wait for
        assert sorted(p.name for p in found.slots.work(stamp).glob("f?")) == []
        assert procs_with(d) == []
    finally:
        found.server.stop()
        found.slots.close()


def test_the_pid_namespace_alone_ends_them(
    homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a pids cgroup (a host that has none to give) bwrap's own PID namespace
    still takes every leaver with it when the command exits, setsid included."""
    from tools.sandbox import run as sandbox

    monkeypatch.setattr("tools.sandbox.run.PidsCgroup.create", lambda max_pids: None)
    monkeypatch.setattr("tools.sandbox.run.POOL.take", lambda merged: None)  # none waits
    work = new_home(homes)
    d = unique_sleep()
    result = sandbox.run(["bash", "-c", leavers(d) + "echo ok"], work, mode="required", merged=True)
    assert (result.mode, result.exit_code, result.stdout) == ("bwrap", 0, "ok\n")
    assert result.warning is not None and "NOT enforced" in result.warning  # no cgroup
    assert procs_with(d) == []
    time.sleep(float(d) + 1.0)
    assert sorted(p.name for p in work.glob("f?")) == [] and procs_with(d) == []


def test_the_pid_namespaces_init_is_in_the_group_the_kill_waits_for(
    homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a pids cgroup the kill signals the command's process group and returns
    once it is dead; only the death of bwrap's init (pid 1 inside) takes the rest of
    its PID namespace down, setsid leavers included. So init must be in that group:
    seen from inside, its group's leader is outside the namespace (group 0), not init
    itself (group 1, as a setsid of bwrap's own would make it)."""
    from tools.sandbox import run as sandbox

    monkeypatch.setattr("tools.sandbox.run.PidsCgroup.create", lambda max_pids: None)
    monkeypatch.setattr("tools.sandbox.run.POOL.take", lambda merged: None)
    work = new_home(homes)
    result = sandbox.run(
        ["bash", "-c", "cut -d' ' -f5 /proc/1/stat"], work, mode="required", merged=True
    )
    assert (result.mode, result.exit_code) == ("bwrap", 0)
    assert result.stdout == "0\n"


def test_nothing_lands_in_the_next_jobs_tree(host: Host) -> None:
    """Job A plants late writers and releases its slot; job B leases the same slot and
    prepares its tree: after every planted write was due, B's tree has none of them."""
    a = host.slots.lease("job-A")
    d = unique_sleep()
    planted = run(host.server.url, a, "job-A:plant", {"command": leavers(d) + "echo planted"})
    assert planted.json()["result"]["output"] == "planted\n"
    host.slots.release(a)
    b = host.slots.lease("job-B")
    assert (b.slot_id, b.generation) == (a.slot_id, a.generation + 1)
    time.sleep(float(d) + 1.0)
    assert sorted(p.name for p in host.slots.work(b).glob("f?")) == []
    assert procs_with(d) == []
    seen = run(host.server.url, b, "job-B:ls", {"command": "ls"})
    assert seen.json()["result"]["output"].split() == ["README", "pkg"]


def test_a_timeout_kills_the_whole_tree(host: Host) -> None:
    """Past timeout_s the command and everything it started (setsid included) is
    killed: exit_code 137 (128 + SIGKILL), timed_out, and nothing left in /proc."""
    stamp = host.slots.lease("job-A")
    d = f"3{unique_sleep()[1:]}"
    command = f"sleep {d} & setsid sleep {d} & echo started; sleep {d}"
    result = run(host.server.url, stamp, "job-A:t", {"command": command, "timeout_s": 1}).json()[
        "result"
    ]
    assert (result["exit_code"], result["timed_out"], result["output"]) == (137, True, "started\n")
    assert procs_with(d) == []


HOSTILE = """\
try() {{ if ( eval "$1" ) 2>/dev/null; then echo "WROTE $1"; else echo "refused $1"; fi; }}
try 'echo x > /pwned-{m}'
try 'echo x > /etc/pwned-{m}'
try 'mkdir -p {home}/repos && echo x > {home}/repos/pwned-{m}'
try 'echo x >> {cache}/HEAD'
try 'echo x > {home}/slots/{other}/work/pwned-{m}'
try 'echo x > {home}/slots/{other}/work/README'
try 'echo x > {home}/slots/{own}/stamp.json'
try 'echo forged >> {home}/slots/{own}/receipts.jsonl'
try 'echo x > ../stamp.json'
try 'echo forged >> ../receipts.jsonl'
try 'exec 3<>/dev/tcp/127.0.0.1/{server_port}'
try 'exec 3<>/dev/tcp/127.0.0.1/{listen_port}'
echo done
"""


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def test_hostile_writes_and_connections_change_nothing_outside_the_tree(host: Host) -> None:
    """Writes to /, to the repository cache, to another slot's tree, to the stamp and
    the receipts, and connections to the tool server and to another port on 127.0.0.1:
    from the host's side, nothing changed and nothing connected."""
    own, other = host.slots.lease("job-A"), host.slots.lease("job-B")
    home = host.server.settings.home
    (cache,) = sorted((home / "repos").iterdir())[:1]
    m = uuid.uuid4().hex[:12]
    before = {
        "repos": snapshot(home / "repos"),
        "other": snapshot(host.slots.dir(other)),
        "stamp": (host.slots.dir(own) / "stamp.json").read_bytes(),
    }
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        command = HOSTILE.format(
            m=m,
            home=home,
            cache=cache,
            own=own.slot_id,
            other=other.slot_id,
            server_port=httpx.URL(host.server.url).port,
            listen_port=listener.getsockname()[1],
        )
        result = run(host.server.url, own, "job-A:hostile", {"command": command}).json()["result"]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing arrived
    assert result["exit_code"] == 0 and result["output"].endswith("done\n"), result
    report = result["output"]
    for line in report.splitlines():
        if "/dev/tcp/" in line:
            assert line.startswith("refused"), report  # no network at all
    assert not Path(f"/pwned-{m}").exists() and not Path(f"/etc/pwned-{m}").exists()
    assert snapshot(home / "repos") == before["repos"]
    assert snapshot(host.slots.dir(other)) == before["other"]
    assert (host.slots.dir(own) / "stamp.json").read_bytes() == before["stamp"]
    receipts = (host.slots.dir(own) / "receipts.jsonl").read_text().splitlines()
    assert all(line.startswith('{"key":') for line in receipts), receipts  # no forged line
    assert not (host.slots.dir(own) / "pwned").exists()


def test_a_fork_bomb_is_bounded_and_the_host_carries_on(host: Host) -> None:
    """A fork bomb meets the process bound and the wall clock; the call ends, nothing of
    it is left, and the same server runs the next command."""
    stamp = host.slots.lease("job-A")
    name = f"bomb_{uuid.uuid4().hex[:10]}"
    command = f"{name}() {{ {name} | {name} & }}; {name}; sleep 30"
    result = run(host.server.url, stamp, "job-A:bomb", {"command": command, "timeout_s": 3})
    assert result.status_code == 200 and result.json()["result"]["timed_out"] is True
    assert procs_with(name) == []
    after = run(host.server.url, stamp, "job-A:after", {"command": "echo fine"})
    assert after.json()["result"]["output"] == "fine\n"
