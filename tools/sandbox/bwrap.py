"""The host's bubblewrap: where it is, the host root it re-binds, and proof it confines.

:func:`self_test` runs a probe under the bwrap found, once per process and bwrap
path (a failure again after a while), and checks from the host's side that no write
escaped and the network stayed unreachable.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tools.sandbox.policy import Limits, SelfTest, bwrap_argv, sandbox_env
from tools.sandbox.process import execute


def root_entries() -> dict[str, str | None]:
    """Each name in the host's ``/`` with its symlink target (None: a directory or file)."""
    entries: dict[str, str | None] = {}
    for entry in os.scandir("/"):
        entries[entry.name] = os.readlink(entry.path) if entry.is_symlink() else None
    return entries


def find_bwrap(path_env: str | None = None) -> str | None:
    """The absolute path of ``bwrap`` on ``path_env`` (default: this process's PATH)."""
    found = shutil.which("bwrap", path=path_env)
    return str(Path(found).absolute()) if found else None


_PROBE = """\
import json, socket, sys
port, nonce, targets = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
report = {"escaped": []}
with open("probe-ok", "w") as f:
    f.write("ok")
for target in targets:
    try:
        open(target, "w").close()
    except OSError:
        continue
    report["escaped"].append(target)
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", port))
    report["net"] = "connected"
    s.sendall(nonce.encode())
except OSError as e:
    report.setdefault("net", "unreachable: %s" % e)
    report["errno"] = e.errno
print(json.dumps(report))
"""

# How a connect from a network namespace of its own ends. Anything else, a timeout
# included, is not proof the host's loopback is out of reach: the self-test fails closed.
_CUT_OFF = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH})

# A failed self-test is probed again once this old: a blip (a host under load past
# the probe's wall clock, a fork refused) must not leave a server refusing every exec
# until it restarts. A passed one is kept for the life of the process.
RETEST_FAILED_AFTER_S = 30.0

_SELF_TESTS: dict[str, tuple[SelfTest, float]] = {}
_SELF_TEST_LOCK = threading.Lock()


def missing() -> SelfTest:
    """The failed self-test of a bwrap that is not there."""
    return SelfTest(False, "bubblewrap (bwrap) not found on PATH", None)


def self_test(bwrap: str | None = None) -> SelfTest:
    """Check once per process and bwrap path that confinement really holds (a failure
    again once it is :data:`RETEST_FAILED_AFTER_S` old)."""
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        return missing()
    with _SELF_TEST_LOCK:
        cached = _SELF_TESTS.get(bwrap)
        if cached is None or (
            not cached[0].ok and time.monotonic() - cached[1] >= RETEST_FAILED_AFTER_S
        ):
            _SELF_TESTS[bwrap] = (_probe(bwrap), time.monotonic())
        return _SELF_TESTS[bwrap][0]


def _probe(bwrap: str) -> SelfTest:
    """Confinement checked from the host's side: the host must be unchanged after."""
    marker, nonce = f".slotrunner-probe-{uuid.uuid4().hex}", uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as listener:
        base, work = Path(tmp), Path(tmp) / "work"
        work.mkdir()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.setblocking(False)
        targets = [Path("/") / marker, base / marker, Path(tempfile.gettempdir()) / marker]
        python = os.path.realpath(sys.executable)
        argv = [python, "-I", "-S", "-c", _PROBE, str(listener.getsockname()[1]), nonce]
        argv += [str(t) for t in targets]
        expose = [Path(sys.base_prefix), Path(python).parent]
        command = bwrap_argv(bwrap, work, root_entries(), [base], expose) + argv
        limits = Limits(wall_s=20.0, processes=1024, output_bytes=64 * 1024)
        try:
            outcome = execute(command, work, sandbox_env(None), limits, None)
        except OSError as e:
            return SelfTest(False, f"bwrap at {bwrap} could not start: {e}", bwrap)
        escaped = [str(t) for t in targets if t.exists()]
        for path in escaped:
            Path(path).unlink(missing_ok=True)
        reached = _nonce_arrived(listener, nonce)
        stderr = outcome.stderr.decode("utf-8", "replace").strip()[-500:]
        if outcome.returncode != 0 or not (work / "probe-ok").exists():
            detail = f"bwrap at {bwrap} failed its self-test (exit {outcome.returncode}): "
            return SelfTest(False, detail + (stderr or "no output"), bwrap)
        if escaped:
            return SelfTest(False, f"bwrap at {bwrap} let a write escape: {escaped}", bwrap)
        try:
            report = json.loads(outcome.stdout)
            net, err = str(report["net"]), report.get("errno")
        except (ValueError, KeyError, TypeError):
            net, err = "unreported", None
        if reached or err not in _CUT_OFF:
            how = "its probe reached a host port" if reached else f"its probe's connect: {net}"
            return SelfTest(False, f"bwrap at {bwrap} left the network reachable ({how})", bwrap)
    return SelfTest(True, f"bwrap at {bwrap} confines writes and network", bwrap)


def _nonce_arrived(listener: socket.socket, nonce: str) -> bool:
    """Whether a connection waiting on ``listener`` carries the probe's ``nonce``.

    Any process on the host may connect to the listener's loopback port while the probe
    runs (a client retrying a port it believes closed, a scanner). Only the probe knows
    the nonce, so only its connection can fail the self-test: a stray one must not turn
    a confining bwrap into "sandbox unavailable" for the life of the process.
    """
    expected = nonce.encode()
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return False
        with conn:
            conn.setblocking(False)  # the probe has exited: what it sent is already here
            try:
                if conn.recv(len(expected) + 1) == expected:
                    return True
            except OSError:
                continue
