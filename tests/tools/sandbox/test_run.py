"""Contained execution (I9): a hostile "test suite" run under the real bubblewrap."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.errors import ToolError
from tools.reasons import Reason
from tools.sandbox import bwrap as bwrap_module
from tools.sandbox import run as sandbox
from tools.sandbox.run import Limits, SandboxResult, SandboxUnavailable, SelfTest

# An interpreter the sandbox can see (the venv and pyenv live under /tmp and /root,
# both replaced by empty tmpfs inside).
PYTHON = "/usr/bin/python3"

HOSTILE = r"""
import json, os, socket, sys, time

stage = sys.argv[1]


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as e:
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}


def write(path):
    with open(path, "w") as f:
        f.write("pwned")


def read(path):
    with open(path) as f:
        return f.read()


if stage == "confine":
    home, base, tmp_marker = sys.argv[2], sys.argv[3], sys.argv[4]
    report = {
        "write_own": attempt(lambda: write("mine.txt")),
        "write_sibling": attempt(lambda: write(home + "/slots/S2/work/pwned.txt")),
        "write_up": attempt(lambda: write("../../S2-pwned.txt")),
        "write_stamp": attempt(lambda: write(home + "/slots/S1/stamp.json")),
        "write_base": attempt(lambda: write(base + "/outside.txt")),
        "write_etc": attempt(lambda: write("/etc/slotrunner-pwned")),
        "write_tmp": attempt(lambda: write(tmp_marker)),
        "read_sibling": attempt(lambda: read(home + "/slots/S2/work/secret.txt")),
        "read_receipts": attempt(lambda: read(home + "/slots/S2/receipts.jsonl")),
        "read_stamp": attempt(lambda: read(home + "/slots/S1/stamp.json")),
        "list_slots": attempt(lambda: os.listdir(home + "/slots")),
        "read_control": attempt(lambda: read(base + "/control.txt")),
        "read_root_home": attempt(lambda: os.listdir("/root")),
    }
    print(json.dumps(report))
elif stage == "net":
    s = socket.socket()
    s.settimeout(2)
    print(json.dumps(attempt(lambda: s.connect(("127.0.0.1", int(sys.argv[2]))))))
elif stage == "fork":
    root = os.getpid()
    told = False
    while True:
        try:
            os.fork()
        except OSError as e:
            if os.getpid() == root and not told:
                print("fork refused: errno %d" % e.errno, flush=True)
                told = True
            time.sleep(0.05)  # the fault itself: every child stays alive, at the limit
elif stage == "alloc":
    hoard = []
    while True:
        hoard.append(bytearray(16 * 1024 * 1024))
elif stage == "flood":
    chunk = "x" * 65536
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10**12):
        sys.stdout.write(chunk)
elif stage == "spin":
    while True:
        pass
elif stage == "fds":
    held = []
    try:
        while True:
            held.append(open("/dev/null"))
    except OSError as e:
        print(json.dumps({"held": len(held), "errno": e.errno}))
elif stage == "sleep":
    # The fault itself: a command and its daemon that never end; the wall clock must.
    if os.fork() == 0:
        os.setsid()  # a daemon that left the process group
        time.sleep(3600)
    time.sleep(3600)
"""


@dataclass(frozen=True)
class Host:
    """A slotrunner home outside /tmp (so hiding it is what makes it invisible)."""

    base: Path
    home: Path
    work: Path

    def state(self) -> dict[str, bytes | None]:
        """Every path under base except our own work tree, with its content."""
        seen: dict[str, bytes | None] = {}
        for path in sorted(self.base.rglob("*")):
            if path == self.work or self.work in path.parents:
                continue
            seen[str(path)] = path.read_bytes() if path.is_file() else None
        return seen


@pytest.fixture
def host() -> Iterator[Host]:
    base = Path(tempfile.mkdtemp(prefix="slotrunner-sandbox-", dir="/var/tmp"))
    try:
        home = base / "home"
        work = home / "slots" / "S1" / "work"
        work.mkdir(parents=True)
        (home / "slots" / "S1" / "stamp.json").write_text('{"slot_id": "S1"}')
        (home / "slots" / "S2" / "work").mkdir(parents=True)
        (home / "slots" / "S2" / "work" / "secret.txt").write_text("job B's code")
        (home / "slots" / "S2" / "receipts.jsonl").write_text('{"key": "k"}\n')
        (base / "control.txt").write_text("visible")
        (work / "hostile.py").write_text(HOSTILE)
        yield Host(base, home, work)
    finally:
        shutil.rmtree(base)


def _run(host: Host, *args: str, mode: str = "required", **limits: float) -> SandboxResult:
    return sandbox.run(
        [PYTHON, "hostile.py", *args],
        host.work,
        mode=mode,  # type: ignore[arg-type]
        limits=Limits(**limits),  # type: ignore[arg-type]
        hide=[host.home],
    )


def _procs_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def test_python_for_the_sandbox_exists() -> None:
    """The interpreter the hostile suite uses is on the read-only system part."""
    assert Path(PYTHON).exists()


def test_self_test_passes_with_the_real_bwrap() -> None:
    """The installed bwrap confines writes and network, and the answer is cached."""
    first = sandbox.self_test()
    assert first.ok, first.detail
    assert first.bwrap == sandbox.find_bwrap()
    assert sandbox.self_test() is first


def test_confinement_hides_other_slots_and_keeps_writes_in_the_slot(host: Host) -> None:
    """Writes land only in the slot; other slots, receipts and the stamp are invisible."""
    tmp_marker = f"/tmp/slotrunner-escape-{uuid.uuid4().hex}"
    before = host.state()
    result = _run(host, "confine", str(host.home), str(host.base), tmp_marker, wall_s=30)
    assert (result.mode, result.exit_code, result.warning) == ("bwrap", 0, None), result
    report = json.loads(result.stdout)
    assert report["write_own"]["ok"]
    assert (host.work / "mine.txt").read_text() == "pwned"
    for name in ("write_sibling", "write_up", "write_stamp", "write_base", "write_etc"):
        assert not report[name]["ok"], name
    for name in ("read_sibling", "read_receipts", "read_stamp"):
        assert not report[name]["ok"], name
    assert report["list_slots"] == {"ok": False, "error": report["list_slots"]["error"]}
    assert report["read_control"] == {"ok": True, "value": "visible"}  # hiding did it
    assert report["read_root_home"] == {"ok": True, "value": []}
    assert report["write_tmp"]["ok"]  # its private /tmp ...
    assert not Path(tmp_marker).exists()  # ... is not the host's
    assert not Path("/etc/slotrunner-pwned").exists()
    assert host.state() == before


def test_network_is_unreachable(host: Host) -> None:
    """A TCP connect to a listening host socket on 127.0.0.1 fails and never arrives."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        result = _run(host, "net", str(listener.getsockname()[1]), wall_s=30)
        assert result.mode == "bwrap"
        assert json.loads(result.stdout)["ok"] is False
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_fork_bomb_is_bounded_and_leaves_nothing(host: Host) -> None:
    """Unbounded forking hits the process limit, the wall clock ends it, nothing stays."""
    marker = f"forkbomb-{uuid.uuid4().hex}"
    limit = 24
    results: list[SandboxResult] = []
    runner = threading.Thread(
        target=lambda: results.append(_run(host, "fork", marker, wall_s=3, processes=limit))
    )
    runner.start()
    most = 0
    while runner.is_alive():
        most = max(most, len(_procs_with(marker)))
        runner.join(0.05)
    (result,) = results
    assert result.timed_out and result.killed_signal == 9, result
    assert "fork refused" in result.stdout
    assert 1 < most <= limit
    assert _procs_with(marker) == []
    assert result.mode == "bwrap" and result.warning is None


@pytest.mark.parametrize("mode", ["required", "off"])
def test_sleep_forever_is_killed_with_its_daemon(host: Host, mode: str) -> None:
    """The wall timeout kills the command and a grandchild that left its process group."""
    marker = f"sleeper-{uuid.uuid4().hex}"
    result = _run(host, "sleep", marker, mode=mode, wall_s=2)
    assert result.timed_out and result.exit_code is None and result.killed_signal == 9
    assert result.mode == ("bwrap" if mode == "required" else "none")
    assert _procs_with(marker) == []


def test_unbounded_allocation_is_stopped_by_the_memory_limit(host: Host) -> None:
    """Allocating without end fails at the address-space limit; the result says so."""
    result = _run(host, "alloc", wall_s=30, memory_bytes=256 * 1024 * 1024)
    assert not result.timed_out
    assert result.exit_code == 1
    assert "MemoryError" in result.stderr


def test_cpu_burner_is_stopped_by_the_cpu_limit(host: Host) -> None:
    """A busy loop is killed by SIGXCPU at cpu_s, well before the wall clock."""
    result = _run(host, "spin", wall_s=60, cpu_s=1)
    assert not result.timed_out
    assert result.killed_signal == signal.SIGXCPU


def test_file_size_is_bounded(host: Host) -> None:
    """Writing past file_bytes kills the writer with SIGXFSZ; the file stops at the cap."""
    dd = ["/bin/dd", "if=/dev/zero", "of=big.bin", "bs=65536", "count=64"]
    limits = Limits(wall_s=30, file_bytes=1024 * 1024)
    result = sandbox.run(dd, host.work, mode="required", limits=limits)
    assert result.killed_signal == signal.SIGXFSZ, result
    assert (host.work / "big.bin").stat().st_size == 1024 * 1024


def test_open_files_are_bounded(host: Host) -> None:
    """Opening files without end fails with EMFILE at open_files."""
    result = _run(host, "fds", wall_s=30, open_files=64)
    report = json.loads(result.stdout)
    assert report["errno"] == errno.EMFILE
    assert report["held"] < 64


def test_endless_output_is_truncated_and_timed_out(host: Host) -> None:
    """Printing forever keeps at most output_bytes and is ended by the wall clock."""
    result = _run(host, "flood", wall_s=2, output_bytes=100_000)
    assert result.timed_out and result.output_truncated
    assert result.stdout == "x" * 100_000


def test_large_output_is_truncated_but_the_exit_code_kept(host: Host) -> None:
    """A command that prints past the cap still finishes; only the capture is cut."""
    result = _run(host, "flood", "20", wall_s=30, output_bytes=65536)
    assert (result.exit_code, result.timed_out, result.output_truncated) == (0, False, True)
    assert len(result.stdout) == 65536


def test_environment_is_minimal(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command sees the base environment and the caller's values, nothing of ours."""
    monkeypatch.setenv("SLOTRUNNER_TOKEN", "secret-token")
    result = sandbox.run(["/usr/bin/env"], host.work, mode="required", env={"CI": "1"})
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert seen.pop("PWD", sandbox.WORK_PATH) == sandbox.WORK_PATH  # bwrap's --chdir sets it
    assert seen == {
        "PATH": sandbox.DEFAULT_PATH,
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "CI": "1",
    }


def test_required_without_bwrap_refuses(host: Host, tmp_path: Path) -> None:
    """mode=required with no bwrap on PATH raises, naming the Debian package; nothing runs."""
    with pytest.raises(SandboxUnavailable) as caught:
        sandbox.run(["/usr/bin/touch", "ran"], host.work, mode="required", path_env=str(tmp_path))
    assert caught.value.reason is Reason.SANDBOX_UNAVAILABLE
    assert "bubblewrap" in caught.value.message
    assert not (host.work / "ran").exists()


def test_auto_without_bwrap_runs_unsandboxed_with_a_warning(host: Host, tmp_path: Path) -> None:
    """mode=auto with no bwrap runs the command anyway, says so, and records mode none."""
    result = sandbox.run(["/usr/bin/touch", "ran"], host.work, mode="auto", path_env=str(tmp_path))
    assert (result.mode, result.exit_code) == ("none", 0)
    assert result.warning is not None and "UNCONFINED" in result.warning
    assert "bubblewrap" in result.warning
    assert (host.work / "ran").exists()


def test_off_never_sandboxes(host: Host) -> None:
    """mode=off runs in the host's view of the work tree, without a warning."""
    result = sandbox.run(["/bin/pwd"], host.work, mode="off")
    assert (result.mode, result.warning, result.stdout.strip()) == ("none", None, str(host.work))


def test_a_bwrap_that_does_not_confine_fails_the_self_test(host: Host, tmp_path: Path) -> None:
    """A 'bwrap' that just runs the command is caught by the self-test and refused."""
    fake = tmp_path / "bwrap"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    test = sandbox.self_test(str(fake))
    assert not test.ok and test.bwrap == str(fake)
    assert "escape" in test.detail or "network" in test.detail
    assert not [p for p in Path("/").iterdir() if p.name.startswith(".slotrunner-probe-")]
    with pytest.raises(SandboxUnavailable, match=f"unavailable: {re.escape(test.detail)}"):
        sandbox.run(["/bin/true"], host.work, mode="required", path_env=str(tmp_path))
    result = sandbox.run(["/bin/true"], host.work, mode="auto", path_env=str(tmp_path))
    assert result.mode == "none" and result.warning is not None


def test_a_broken_bwrap_fails_the_self_test(tmp_path: Path) -> None:
    """A bwrap that cannot start a sandbox gives a failed self-test with its message."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    test = sandbox.self_test(str(fake))
    assert not test.ok
    assert "No permissions" in test.detail


# A bwrap in front of the real one, for the self-test's network check: {before} runs on
# the host with the probe's port (its nonce is the argument after it), then the real
# bwrap runs with {args}.
_WRAPPER = """\
#!{python}
import socket, subprocess, sys
args = sys.argv[1:]
at = args.index("-c", args.index("--"))
port = int(args[at + 2])
held = []
{before}
sys.exit(subprocess.run([{real!r}, *{args}]).returncode)
"""


def _wrapped_bwrap(tmp_path: Path, before: str, args: str = "args") -> str:
    real = sandbox.find_bwrap()
    assert real is not None
    fake = tmp_path / "bwrap"
    fake.write_text(_WRAPPER.format(python=sys.executable, real=real, before=before, args=args))
    fake.chmod(0o755)
    return str(fake)


_SHARE_NET = '[args[0], "--share-net", *args[1:]]'  # bwrap: keep the host's network


def test_a_stray_connection_to_the_probe_port_does_not_fail_the_self_test(
    tmp_path: Path,
) -> None:
    """Another host process connecting to the probe's loopback port (a client retrying a
    port it thinks closed) is not the sandbox reaching the network: the real bwrap still
    passes, instead of being cached as unavailable for the life of the process."""
    stray = 'held.append(socket.create_connection(("127.0.0.1", port)))\n'
    stray += 'held[0].sendall(b"*1\\r\\n$4\\r\\nPING\\r\\n")'
    test = sandbox.self_test(_wrapped_bwrap(tmp_path, stray))
    assert test.ok, test.detail


@pytest.mark.parametrize(
    ("forge", "detail"),
    [
        ("", "(its probe reached a host port)"),
        ("args[at + 3] = 'f' * 32", "(its probe's connect: connected)"),
    ],
)
def test_a_bwrap_that_keeps_the_network_fails_on_either_check(
    tmp_path: Path, forge: str, detail: str
) -> None:
    """The real bwrap told to keep the host's network: the host sees the probe's nonce
    arrive, and when the nonce is forged the probe's own report still fails it."""
    test = sandbox.self_test(_wrapped_bwrap(tmp_path, forge, _SHARE_NET))
    assert not test.ok
    assert test.detail.endswith("left the network reachable " + detail), test.detail


def test_a_probe_connect_that_times_out_fails_closed(tmp_path: Path) -> None:
    """A connect that neither lands nor is refused proves nothing: with the host's network
    kept and the probe's listener queue filled from the host, the probe's connect times
    out and the self-test fails rather than reading the timeout as "unreachable"."""
    fill = "for _ in range(200):\n"
    fill += "    c = socket.socket()\n    c.setblocking(False)\n"
    fill += '    c.connect_ex(("127.0.0.1", port))\n    held.append(c)\n'
    fill += "import time; time.sleep(0.2)"
    test = sandbox.self_test(_wrapped_bwrap(tmp_path, fill, _SHARE_NET))
    assert not test.ok
    assert "left the network reachable (its probe's connect: unreachable: timed out)" in (
        test.detail
    ), test.detail


def test_a_failed_self_test_is_probed_again_after_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap that fails once (a blip) and then confines: the failure is kept while it
    is young, probed again once it is old enough, and the pass is then kept for good."""
    runs = tmp_path / "runs"
    blip = f"with open({str(runs)!r}, 'a') as f:\n    f.write('x')\n"
    blip += f"if open({str(runs)!r}).read() == 'x':\n"
    blip += "    print('bwrap: blip', file=sys.stderr)\n    sys.exit(1)"
    fake = _wrapped_bwrap(tmp_path, blip)
    first = sandbox.self_test(fake)
    assert not first.ok and "blip" in first.detail
    assert sandbox.self_test(fake) is first  # younger than RETEST_FAILED_AFTER_S
    monkeypatch.setattr(bwrap_module, "RETEST_FAILED_AFTER_S", 0.0)
    second = sandbox.self_test(fake)
    assert second.ok, second.detail
    assert sandbox.self_test(fake) is second
    assert runs.read_text() == "xx"


def test_bad_input_is_refused_clearly(host: Host) -> None:
    """An empty or string argv, a missing work dir, a bad mode or a zero limit is malformed."""
    cases: list[tuple[object, Path, str, str]] = [
        ([], host.work, "off", "argv must be a non-empty list"),
        ("ls -l", host.work, "off", "argv must be a non-empty list"),
        (["ls"], host.work / "missing", "off", "work dir .*/missing does not exist"),
        (["ls"], host.work, "sometimes", "mode 'sometimes': expected required"),
    ]
    for argv, work, mode, problem in cases:
        with pytest.raises(ToolError, match=problem) as caught:
            sandbox.run(argv, work, mode=mode)  # type: ignore[arg-type]
        assert caught.value.reason is Reason.MALFORMED
    with pytest.raises(ToolError, match="wall_s=0"):
        sandbox.run(["ls"], host.work, mode="off", limits=Limits(wall_s=0))


def test_choose_mode_table() -> None:
    """The policy table: off never sandboxes; required refuses; auto falls back loudly."""
    good = SelfTest(True, "fine", "/usr/bin/bwrap")
    bad = SelfTest(False, "bwrap missing", None)
    assert sandbox.choose_mode("off", good) == ("none", None)
    assert sandbox.choose_mode("auto", good) == ("bwrap", None)
    assert sandbox.choose_mode("required", good) == ("bwrap", None)
    used, warning = sandbox.choose_mode("auto", bad)
    assert used == "none" and warning is not None and "bwrap missing" in warning
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        sandbox.choose_mode("required", bad)


def test_exit_status_decoding() -> None:
    """Signals show as killed_signal, both from Popen and from bwrap's 128+N."""
    assert sandbox.exit_status(0, "bwrap") == (0, None)
    assert sandbox.exit_status(-9, "none") == (None, 9)
    assert sandbox.exit_status(137, "bwrap") == (None, 9)
    assert sandbox.exit_status(137, "none") == (137, None)


def test_work_is_bound_after_the_hidden_home() -> None:
    """The slot's work dir (inside the hidden home) is mounted after the tmpfs over home."""
    home = Path("/srv/slotrunner")
    argv = sandbox.bwrap_argv(
        "/usr/bin/bwrap", home / "slots/S1/work", {"usr": None, "bin": "usr/bin"}, [home]
    )
    hide_at = argv.index(str(home))
    bind_at = argv.index(str(home / "slots/S1/work"))
    assert argv[hide_at - 1] == "--tmpfs" and hide_at < bind_at
    assert argv[bind_at + 1] == sandbox.WORK_PATH
    assert argv[-1] == "--" and "--unshare-all" in argv and "--die-with-parent" in argv


def test_returns_quickly_after_the_command_exits(host: Host) -> None:
    """A background child that keeps the pipes open is killed when the command exits."""
    marker = f"lingerer-{uuid.uuid4().hex}"
    script = f"sleep 3600 # {marker}\n"
    (host.work / "bg.sh").write_text(f"/bin/sh -c '{script.strip()}' &\nexit 0\n")
    result = sandbox.run(["/bin/sh", "bg.sh"], host.work, mode="off", limits=Limits(wall_s=30))
    assert (result.exit_code, result.timed_out) == (0, False)  # not waited out
    assert _procs_with(marker) == []


def test_the_python_shim_sets_the_same_limits_as_prlimit(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where util-linux's prlimit is missing, the Python shim applies the same limits
    and reports a missing command the same way (127)."""
    from tools.sandbox import shim

    probe = ["/bin/bash", "-c", "for o in t n f v; do ulimit -$o; done"]
    limits = Limits(wall_s=30, cpu_s=7, open_files=77, file_bytes=1024 * 1024)
    seen = []
    for prlimit in (shim.find_prlimit(), None):
        monkeypatch.setattr("tools.sandbox.process.find_prlimit", lambda found=prlimit: found)
        result = sandbox.run(probe, host.work, mode="off", limits=limits, merged=True)
        missing = sandbox.run(["no-such-command"], host.work, mode="off", merged=True)
        seen.append((result.exit_code, result.stdout, missing.exit_code))
    assert seen[0] == seen[1] and seen[0][0] == 0 and seen[0][2] == 127
    assert seen[0][1].split() == ["7", "77", "1024", str(limits.memory_bytes // 1024)]
