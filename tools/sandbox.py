"""Run repository code (a test command, any argv) contained: invariant I9.

What holds for every run, sandboxed or not:

- resource limits (CPU seconds, address space, open files, file size) are set in the
  child by a tiny Python shim that then ``exec``s the command; no ``preexec_fn``, which
  can deadlock a threaded server (uvicorn, Celery) between fork and exec;
- processes are bounded by a fresh pids cgroup when one is writable, because
  ``RLIMIT_NPROC`` is not enforced for root (the kernel skips it for the initial user),
  so as root it would not stop a fork bomb; without a cgroup ``RLIMIT_NPROC`` is set
  (it binds for any other uid) and the result's ``warning`` says the bound is weak;
- output is read incrementally and each stream keeps at most ``output_bytes`` (the rest
  is read and dropped so the child never blocks on a full pipe);
- a wall-clock deadline kills the process group and every process of the cgroup, and
  after the command exits any process it left behind is killed as well.

With ``mode="bwrap"`` the command also runs under bubblewrap: a read-only view of the
host, the slot's work tree read-write at :data:`WORK_PATH`, a private ``/tmp`` and
``/run``, empty ``/root``, ``/home`` and every ``hide`` path, no network, its own PID,
IPC, UTS and user namespaces, no capabilities, and a PID namespace that dies with the
runner. Policy (``SandboxMode``): ``required`` refuses without a working bwrap,
``auto`` falls back to unsandboxed with a loud warning, ``off`` never sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.settings import SandboxMode
from tools.reasons import Reason, ToolError

WORK_PATH = "/slot/work"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "install the Debian package 'bubblewrap' (apt-get install bubblewrap)"
# Host top-level entries never shown as they are: replaced by empty or private tmpfs.
_PRIVATE_DIRS = ("/tmp", "/run", "/root", "/home")
_SKIPPED_ROOT = {"proc", "dev", "tmp", "run", "root", "home"}
_MiB = 1024 * 1024
_READ_CHUNK = 64 * 1024
_GRACE_S = 5.0


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 60
    wall_s: float = 120.0
    memory_bytes: int = 2048 * _MiB
    processes: int = 256
    open_files: int = 256
    output_bytes: int = _MiB
    file_bytes: int = 256 * _MiB


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None
    timed_out: bool
    killed_signal: int | None
    stdout: str
    stderr: str
    output_truncated: bool
    mode: str  # "bwrap" | "none"
    warning: str | None
    duration_ms: float


@dataclass(frozen=True)
class SelfTest:
    ok: bool
    detail: str
    bwrap: str | None


class SandboxUnavailable(ToolError):
    """The sandbox is required but bubblewrap is missing or does not confine."""

    reason = Reason.SANDBOX_UNAVAILABLE


# -- pure decisions ------------------------------------------------------------------


def choose_mode(mode: SandboxMode, test: SelfTest | None) -> tuple[str, str | None]:
    """(mode used, warning) for a policy and the self-test of the bwrap found."""
    if mode == "off":
        return "none", None
    if test is not None and test.ok:
        return "bwrap", None
    detail = test.detail if test is not None else "no self-test"
    if mode == "required":
        raise SandboxUnavailable(
            f"sandbox required (SLOTRUNNER_SANDBOX=required) but unavailable: {detail}; "
            f"{INSTALL_HINT}"
        )
    return "none", f"SANDBOX UNAVAILABLE, repository code ran UNCONFINED: {detail}; {INSTALL_HINT}"


def bwrap_argv(
    bwrap: str,
    work: Path,
    root_entries: Mapping[str, str | None],
    hide: Sequence[Path] = (),
    expose: Sequence[Path] = (),
) -> list[str]:
    """The bwrap command line up to (and including) ``--``.

    ``root_entries`` maps each name in the host's ``/`` to its symlink target (None
    for a directory or file). The new root is a tmpfs holding read-only binds of
    those entries, so :data:`WORK_PATH` can be created in it; it is remounted
    read-only last. ``expose`` re-binds host paths read-only after the hiding (the
    self-test uses it to reach its own interpreter).
    """
    argv = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
    argv += ["--die-with-parent", "--new-session", "--tmpfs", "/"]
    for name, target in sorted(root_entries.items()):
        if name in _SKIPPED_ROOT:
            continue
        if target is not None:
            argv += ["--symlink", target, f"/{name}"]
        else:
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for private in _PRIVATE_DIRS:
        argv += ["--tmpfs", private]
    for path in hide:
        if not any(path.is_relative_to(p) for p in _PRIVATE_DIRS):
            argv += ["--tmpfs", str(path)]
    for path in expose:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--dir", str(Path(WORK_PATH).parent), "--bind", str(work), WORK_PATH]
    argv += ["--chdir", WORK_PATH, "--remount-ro", "/", "--"]
    return argv


def rlimits(limits: Limits, bound_nproc: bool) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) for the shim; CPU gets a SIGKILL second after SIGXCPU."""
    rows = [
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
        ("RLIMIT_AS", limits.memory_bytes, limits.memory_bytes),
        ("RLIMIT_NOFILE", limits.open_files, limits.open_files),
        ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes),
        ("RLIMIT_CORE", 0, 0),
    ]
    if bound_nproc:
        rows.append(("RLIMIT_NPROC", limits.processes, limits.processes))
    return rows


def sandbox_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The whole environment of the command: a minimal base, then the caller's values."""
    env = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for key, value in (extra or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ToolError(f"sandbox env: invalid variable {key!r}", Reason.MALFORMED)
        env[key] = value
    return env


def exit_status(returncode: int, mode: str) -> tuple[int | None, int | None]:
    """(exit_code, killed_signal). bwrap reports a signal death as 128+N, like a shell."""
    if returncode < 0:
        return None, -returncode
    if mode == "bwrap" and 128 < returncode <= 128 + 64:
        return None, returncode - 128
    return returncode, None


# -- the child shim ------------------------------------------------------------------

# Python ignores SIGPIPE and SIGXFSZ at startup and ignored signals survive exec, so
# the shim restores them: a command past its file-size limit must die, as anywhere else.
_SHIM = """\
import os, resource, signal, sys
procs, spec, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
try:
    if procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    for row in filter(None, spec.split(",")):
        name, soft, hard = row.split(":")
        res = getattr(resource, name)
        cap = resource.getrlimit(res)[1]
        soft, hard = int(soft), int(hard)
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        resource.setrlimit(res, (soft, hard))
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot apply limits: %s\\n" % e)
    os._exit(126)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot execute %r: %s\\n" % (argv[0], e))
    os._exit(127)
"""


# -- pids cgroup ---------------------------------------------------------------------


class _PidsCgroup:
    """A fresh pids cgroup (v1 or v2) for one run: bounds and finds every descendant."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> _PidsCgroup | None:
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
        deadline = time.monotonic() + _GRACE_S
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)  # processes leave the cgroup once the kernel reaps them

    def remove(self) -> None:
        deadline = time.monotonic() + _GRACE_S
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left for an operator; the name says whose it was
                self.kill_all()
                time.sleep(0.01)


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


# -- running -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    truncated: bool


def _exited(pid: int) -> bool:
    """Has the child exited? Without reaping it, so its pid cannot be reused meanwhile."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_tree(proc: subprocess.Popen[bytes], cgroup: _PidsCgroup | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # our child leads its own session and group
    if cgroup is not None:
        cgroup.kill_all()


def _execute(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    cgroup: _PidsCgroup | None,
) -> _Outcome:
    spec = ",".join(f"{n}:{s}:{h}" for n, s, h in rlimits(limits, cgroup is None))
    procs = str(cgroup.procs_file) if cgroup is not None else ""
    shim = [sys.executable, "-I", "-S", "-c", _SHIM, procs, spec, *command]
    proc = subprocess.Popen(
        shim,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = timed_out = killed = False
    deadline = time.monotonic() + limits.wall_s
    pidfd = os.pidfd_open(proc.pid)  # readable once the child exits: no polling
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(pidfd, selectors.EVENT_READ)
            for fd in buffers:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            exited = False
            while True:
                if not exited and _exited(proc.pid):
                    exited = True
                    sel.unregister(pidfd)
                    if not killed:
                        # What it left running in the background may still hold our pipes.
                        _kill_tree(proc, cgroup)
                        killed, deadline = True, min(deadline, time.monotonic() + _GRACE_S)
                if exited and not sel.get_map():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if killed:
                        break  # a process we cannot kill holds a pipe: stop reading
                    timed_out = killed = True
                    _kill_tree(proc, cgroup)
                    deadline = time.monotonic() + _GRACE_S
                    continue
                for key, _ in sel.select(remaining):
                    fd = int(key.fd)
                    if fd == pidfd:
                        continue
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    room = limits.output_bytes - len(buffers[fd])
                    truncated = truncated or len(chunk) > room
                    buffers[fd] += chunk[: max(room, 0)]
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        _kill_tree(proc, cgroup)  # before reaping, while its group id cannot be reused
        returncode = proc.wait()
    finally:
        if proc.returncode is None:  # interrupted: never leave the command running
            _kill_tree(proc, cgroup)
            proc.wait()
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    out, err = (bytes(b) for b in buffers.values())
    return _Outcome(returncode, timed_out, out, err, truncated)


def _root_entries() -> dict[str, str | None]:
    entries: dict[str, str | None] = {}
    for entry in os.scandir("/"):
        entries[entry.name] = os.readlink(entry.path) if entry.is_symlink() else None
    return entries


def find_bwrap(path_env: str | None = None) -> str | None:
    """The absolute path of ``bwrap`` on ``path_env`` (default: this process's PATH)."""
    found = shutil.which("bwrap", path=path_env)
    return str(Path(found).absolute()) if found else None


def run(
    argv: Sequence[str],
    work: Path,
    *,
    mode: SandboxMode,
    limits: Limits = Limits(),  # frozen, so one shared default is safe
    hide: Sequence[Path] = (),
    expose: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    path_env: str | None = None,
) -> SandboxResult:
    """Run ``argv`` with ``work`` as its (read-write) working tree, contained.

    ``hide`` lists host directories shown empty inside the sandbox (the caller passes
    ``$SLOTRUNNER_HOME``; ``work`` may lie inside one: it is mounted afterwards, at
    :data:`WORK_PATH`). ``env`` adds to the minimal environment. Each of stdout and
    stderr keeps at most ``limits.output_bytes``; the rest is read and dropped.
    Raises :class:`SandboxUnavailable` when ``mode="required"`` and bwrap is missing
    or fails its self-test, and :class:`ToolError` (``malformed``) for bad input.
    """
    if isinstance(argv, str | bytes) or not argv or not all(isinstance(a, str) for a in argv):
        raise ToolError("sandbox argv must be a non-empty list of strings", Reason.MALFORMED)
    if mode not in ("required", "auto", "off"):
        raise ToolError(f"sandbox mode {mode!r}: expected required|auto|off", Reason.MALFORMED)
    bad = [f"{k}={v}" for k, v in vars(limits).items() if not v > 0]
    if bad:
        raise ToolError(f"sandbox limits must be positive: {', '.join(bad)}", Reason.MALFORMED)
    work = Path(work).resolve()
    if not work.is_dir():
        raise ToolError(f"sandbox work dir {work} does not exist", Reason.MALFORMED)
    full_env = sandbox_env(env)
    test = None
    if mode != "off":
        bwrap = find_bwrap(path_env)
        test = self_test(bwrap) if bwrap else _missing()
    used, warning = choose_mode(mode, test)
    cgroup = _PidsCgroup.create(limits.processes)
    if cgroup is None and os.geteuid() == 0:
        note = "process limit NOT enforced: running as root with no writable pids cgroup"
        warning = f"{warning}; {note}" if warning else note
    command = list(argv)
    if used == "bwrap":
        assert test is not None and test.bwrap is not None
        # Only directories can be covered; one that does not exist has nothing to hide.
        hidden = [p for p in (Path(h).resolve() for h in hide) if p.is_dir()]
        shown = [p for p in (Path(e).resolve() for e in expose) if p.exists()]
        command = bwrap_argv(test.bwrap, work, _root_entries(), hidden, shown) + command
    started = time.monotonic()
    try:
        outcome = _execute(command, work, full_env, limits, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()
    exit_code, killed_signal = exit_status(outcome.returncode, used)
    return SandboxResult(
        exit_code=exit_code,
        timed_out=outcome.timed_out,
        killed_signal=killed_signal,
        stdout=outcome.stdout.decode("utf-8", "replace"),
        stderr=outcome.stderr.decode("utf-8", "replace"),
        output_truncated=outcome.truncated,
        mode=used,
        warning=warning,
        duration_ms=(time.monotonic() - started) * 1000.0,
    )


# -- self-test -----------------------------------------------------------------------

_PROBE = """\
import json, socket, sys
port, targets, report = int(sys.argv[1]), sys.argv[2:], {"escaped": []}
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
except OSError as e:
    report["net"] = "unreachable: %s" % e
print(json.dumps(report))
"""

_SELF_TESTS: dict[str, SelfTest] = {}
_SELF_TEST_LOCK = threading.Lock()


def _missing() -> SelfTest:
    return SelfTest(False, "bubblewrap (bwrap) not found on PATH", None)


def self_test(bwrap: str | None = None) -> SelfTest:
    """Check once per process and bwrap path that confinement really holds."""
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        return _missing()
    with _SELF_TEST_LOCK:
        if bwrap not in _SELF_TESTS:
            _SELF_TESTS[bwrap] = _probe(bwrap)
        return _SELF_TESTS[bwrap]


def _probe(bwrap: str) -> SelfTest:
    """Confinement checked from the host's side: the host must be unchanged after."""
    marker = f".slotrunner-probe-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as listener:
        base, work = Path(tmp), Path(tmp) / "work"
        work.mkdir()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        targets = [Path("/") / marker, base / marker, Path(tempfile.gettempdir()) / marker]
        python = os.path.realpath(sys.executable)
        argv = [python, "-I", "-S", "-c", _PROBE, str(listener.getsockname()[1])]
        argv += [str(t) for t in targets]
        expose = [Path(sys.base_prefix), Path(python).parent]
        command = bwrap_argv(bwrap, work, _root_entries(), [base], expose) + argv
        limits = Limits(wall_s=20.0, processes=1024, output_bytes=64 * 1024)
        try:
            outcome = _execute(command, work, sandbox_env(None), limits, None)
        except OSError as e:
            return SelfTest(False, f"bwrap at {bwrap} could not start: {e}", bwrap)
        escaped = [str(t) for t in targets if t.exists()]
        for path in escaped:
            Path(path).unlink(missing_ok=True)
        try:
            listener.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
        stderr = outcome.stderr.decode("utf-8", "replace").strip()[-500:]
        if outcome.returncode != 0 or not (work / "probe-ok").exists():
            detail = f"bwrap at {bwrap} failed its self-test (exit {outcome.returncode}): "
            return SelfTest(False, detail + (stderr or "no output"), bwrap)
        if escaped:
            return SelfTest(False, f"bwrap at {bwrap} let a write escape: {escaped}", bwrap)
        try:
            net = json.loads(outcome.stdout)["net"]
        except (ValueError, KeyError, TypeError):
            net = "unreported"
        if reached or not str(net).startswith("unreachable"):
            return SelfTest(False, f"bwrap at {bwrap} left the network reachable", bwrap)
    return SelfTest(True, f"bwrap at {bwrap} confines writes and network", bwrap)
