"""The sandbox's pure decisions and the records they take: nothing here touches the host.

Which mode a policy and a self-test give (:func:`choose_mode`), the bwrap command
line (:func:`bwrap_argv`, with the binds of a slot's :class:`SlotLayout`), the rlimits
the child shim applies (:func:`rlimits`), the command's whole environment
(:func:`sandbox_env`) and how a return code reads (:func:`exit_status`).
``tools/sandbox/run.py`` re-exports every public name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.core.settings import SandboxMode
from tools.errors import ToolError
from tools.reasons import Reason

WORK_PATH = "/slot/work"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "install the Debian package 'bubblewrap' (apt-get install bubblewrap)"
# Host top-level entries never shown as they are: replaced by empty or private tmpfs.
_PRIVATE_DIRS = ("/tmp", "/run", "/root", "/home")
_SKIPPED_ROOT = {"proc", "dev", "tmp", "run", "root", "home"}
_MiB = 1024 * 1024


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
class Bind:
    """A host path shown at ``dest`` inside the sandbox, read-only unless ``writable``."""

    source: Path
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class SlotLayout:
    """A slot as every sandboxed command sees it (``tools/sandbox/layout.py`` builds it).

    ``work`` is bound read-write at :data:`WORK_PATH`, ``hide`` shown empty, and
    ``binds`` mounted after the work tree, in order (docs/architecture.md §Agent git).
    """

    work: Path
    binds: tuple[Bind, ...] = ()
    hide: tuple[Path, ...] = ()


@dataclass(frozen=True)
class SelfTest:
    ok: bool
    detail: str
    bwrap: str | None


class SandboxUnavailable(ToolError):
    """The sandbox is required but bubblewrap is missing or does not confine."""

    reason = Reason.SANDBOX_UNAVAILABLE


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
    binds: Sequence[Bind] = (),
    network: bool = False,
) -> list[str]:
    """The bwrap command line up to (and including) ``--``.

    ``root_entries`` maps each name in the host's ``/`` to its symlink target (None
    for a directory or file). The new root is a tmpfs holding read-only binds of
    those entries, so :data:`WORK_PATH` can be created in it; it is remounted
    read-only last. ``expose`` re-binds host paths read-only after the hiding (the
    self-test uses it to reach its own interpreter). ``binds`` (a slot's
    :class:`SlotLayout`) come after the work tree, so one may cover a path in it.
    ``network`` keeps the host's network: only an environment's setup asks for it
    (docs/architecture.md §Environments), never ``run_tests`` or ``exec``.
    """
    argv = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
    if network:
        argv.append("--share-net")
    # No --new-session: bwrap calls setsid() before it forks its init (pid 1 inside),
    # which would take that init out of the process group the kill without a cgroup
    # signals and waits for (tools/sandbox/process.py), and only the init's death takes
    # the rest of the PID namespace down. Every launcher starts bwrap in a new session
    # of its own (start_new_session), so nothing inside has a controlling terminal to
    # push input into (the TIOCSTI escape --new-session guards against).
    argv += ["--die-with-parent", "--tmpfs", "/"]
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
    for bind in binds:
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), bind.dest]
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
