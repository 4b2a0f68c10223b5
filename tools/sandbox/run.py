"""Run repository code (a test command, any argv) contained: invariant I9.

What holds for every run, sandboxed or not:

- resource limits (CPU seconds, address space, open files, file size) are set in the
  child by ``prlimit`` (or, without it, a tiny Python shim) that then ``exec``s the
  command; no ``preexec_fn``, which can deadlock a threaded server (uvicorn, Celery)
  between fork and exec;
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

Where things live: the pure decisions and the records they take (:class:`Limits`,
:class:`SelfTest`, :class:`SandboxUnavailable`, the mode policy, the bwrap command
line, rlimits, environment, exit status) in ``tools/sandbox/policy.py``; the pids
cgroup in ``tools/sandbox/cgroup.py``; how the child takes its limits in
``tools/sandbox/shim.py``; the bounded, killable run of one command in
``tools/sandbox/process.py``; finding bwrap and its self-test in
``tools/sandbox/bwrap.py``. This module is the entry point, :func:`run`, and
re-exports every public name, so ``tools.sandbox.run.X`` keeps working.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.core.settings import SandboxMode
from tools.errors import ToolError
from tools.reasons import Reason
from tools.sandbox.bwrap import find_bwrap, missing, root_entries, self_test
from tools.sandbox.cgroup import PidsCgroup
from tools.sandbox.policy import (
    DEFAULT_PATH,
    INSTALL_HINT,
    WORK_PATH,
    Limits,
    SandboxUnavailable,
    SelfTest,
    SlotLayout,
    bwrap_argv,
    choose_mode,
    exit_status,
    rlimits,
    sandbox_env,
)
from tools.sandbox.process import Outcome, execute, execute_in
from tools.sandbox.zygote import POOL, takes_clearenv, with_env

__all__ = [
    "DEFAULT_PATH",
    "INSTALL_HINT",
    "WORK_PATH",
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "SelfTest",
    "SlotLayout",
    "bwrap_argv",
    "choose_mode",
    "exit_status",
    "find_bwrap",
    "rlimits",
    "run",
    "sandbox_env",
    "sandbox_used",
    "self_test",
]


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


def sandbox_used(mode: SandboxMode, path_env: str | None = None) -> tuple[str, str | None]:
    """(mode, warning) a run under the policy ``mode`` would have here; nothing is run but
    the (cached) self-test. Raises :class:`SandboxUnavailable` as :func:`run` would."""
    if mode == "off":
        return "none", None
    bwrap = find_bwrap(path_env)
    return choose_mode(mode, self_test(bwrap) if bwrap else missing())


def run(
    argv: Sequence[str],
    work: Path,
    *,
    mode: SandboxMode,
    limits: Limits = Limits(),  # noqa: B008 -- frozen, so one shared default is safe
    hide: Sequence[Path] = (),
    expose: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    path_env: str | None = None,
    merged: bool = False,
    layout: SlotLayout | None = None,
    network: bool = False,
) -> SandboxResult:
    """Run ``argv`` with ``work`` as its (read-write) working tree, contained.

    ``hide`` lists host directories shown empty inside the sandbox (the caller passes
    ``$SLOTRUNNER_HOME``; ``work`` may lie inside one: it is mounted afterwards, at
    :data:`WORK_PATH`). ``layout`` is the slot's view, which every sandboxed command of
    a slot passes (``tools.sandbox.layout.slot_layout``: its hidden home and the agent's
    git binds; ``work`` is then ``layout.work``). ``env`` adds to the minimal
    environment. Each of stdout and stderr keeps at most ``limits.output_bytes``; the
    rest is read and dropped. With ``merged`` both go to one pipe, in order, into
    ``stdout`` (its head and tail kept, the middle dropped with a marker); ``stderr``
    is then empty. ``network`` keeps the host's network (an environment's setup only).
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
        test = self_test(bwrap) if bwrap else missing()
    used, warning = choose_mode(mode, test)
    command = list(argv)
    if used == "bwrap":
        assert test is not None and test.bwrap is not None
        # Only directories can be covered; one that does not exist has nothing to hide.
        hides = [*hide, *(layout.hide if layout is not None else ())]
        hidden = [p for p in (Path(h).resolve() for h in hides) if p.is_dir()]
        shown = [p for p in (Path(e).resolve() for e in expose) if p.exists()]
        binds = layout.binds if layout is not None else ()
        command = (
            bwrap_argv(test.bwrap, work, root_entries(), hidden, shown, binds, network=network)
            + command
        )
    started = time.monotonic()
    POOL.begin()
    try:
        outcome = _in_zygote(command, full_env, limits, merged) if used == "bwrap" else None
        if outcome is None:
            cgroup = PidsCgroup.create(limits.processes)
            if cgroup is None and os.geteuid() == 0:
                note = "process limit NOT enforced: running as root with no writable pids cgroup"
                warning = f"{warning}; {note}" if warning else note
            try:
                outcome = execute(command, work, full_env, limits, cgroup, merged=merged)
            finally:
                if cgroup is not None:
                    cgroup.remove()
    finally:
        POOL.end()
    if used == "bwrap" and takes_clearenv(command[0]):
        POOL.refill(limits.processes, merged)  # for a later run, once the host is quiet
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


def _in_zygote(
    command: Sequence[str], env: Mapping[str, str], limits: Limits, merged: bool
) -> Outcome | None:
    """The bwrap ``command`` run by a zygote already in its pids cgroup (its environment
    set by bwrap: ``tools/sandbox/zygote.py``); None: none was ready, run it afresh."""
    if not takes_clearenv(command[0]):
        return None
    zygote = POOL.take(merged)
    return None if zygote is None else execute_in(zygote, with_env(command, env), limits)
