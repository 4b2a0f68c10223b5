"""The ``exec`` tool: one bash command in the slot's work tree, contained, and ended whole.

The contract is docs/architecture.md §Exec tool. In short:

- ``bash -c command`` runs with the work tree as its working directory, under the
  sandbox of ``run_tests`` (``tools.sandbox.run``): the tree writable, the rest of the
  host read-only, ``$SLOTRUNNER_HOME`` hidden, no network, bounds on CPU, memory,
  processes, open files, file size, output and wall time (``timeout_s``).
- stdout and stderr are one pipe, so ``output`` keeps the order they were written
  in; it holds at most ``registry.EXEC_OUTPUT_BYTES`` (head and tail, a marker for
  the dropped middle; ``truncated`` says so).
- ``exit_code`` is always an integer, what a shell's ``$?`` would say: the command's
  exit status, or 128 + N when a signal N ended it. A command past its ``timeout_s``
  is killed with SIGKILL, so it reports 137 with ``timed_out: true``.
- Nothing outlives the call: under bubblewrap the command is in its own PID
  namespace, which the kernel empties when the command exits or bwrap is killed (on
  the deadline, or when the tool server dies: ``--die-with-parent``); the process
  group and the pids cgroup are killed as well (``tools.sandbox.process``).
- The sandbox never falls back: ``SLOTRUNNER_SANDBOX=required`` and ``auto`` both need
  a bwrap that passes its self-test, or the call is refused ``sandbox_unavailable``
  before its intent is written (:func:`require_sandbox`); the ``auto`` fallback is for
  the job's fixed test command only. ``off`` is the operator's explicit choice: the
  command runs on the host (``sandbox: "none"``) with the same limits, its process
  group and pids cgroup killed after it; without a writable pids cgroup a process
  that left the group (``setsid``) is not found, and nothing confines what it writes.
"""

from __future__ import annotations

import math
from typing import Any

from runner.core.settings import SandboxMode, Settings
from tools import builtin, registry
from tools.sandbox import run as sandbox
from tools.sandbox.bwrap import missing

SHELL = "bash"  # found on the sandbox's PATH (tools.sandbox.policy.DEFAULT_PATH)


def sandbox_mode(settings: Settings) -> SandboxMode:
    """The mode exec runs with: ``off`` only when the operator chose it, else ``required``."""
    return "off" if settings.sandbox == "off" else "required"


def require_sandbox(settings: Settings, path_env: str | None = None) -> None:
    """Raise ``SandboxUnavailable`` unless exec can run as its policy says.

    Asked before the intent of a new key is written, so a refused call leaves no
    receipt; ``path_env`` is where bwrap is looked for (default: this process's PATH).
    """
    if sandbox_mode(settings) == "off":
        return
    bwrap = sandbox.find_bwrap(path_env)
    sandbox.choose_mode("required", sandbox.self_test(bwrap) if bwrap else missing())


def exit_code(result: sandbox.SandboxResult) -> int:
    """The shell's ``$?`` of a run: its exit status, or 128 + the signal that ended it."""
    if result.exit_code is not None:
        return result.exit_code
    return 128 + (result.killed_signal or 9)


def exec_command(
    ctx: builtin.Context, args: Any, *, job_id: str, generation: int
) -> dict[str, Any]:
    """Run ``args.command`` in the slot's tree; every process it started is dead on return.

    With the job's built environment (``job.json``), it is shown read-only as
    ``run_tests`` shows it; a slot with no job description of this lease runs the
    command with the host's tools only.
    """
    timeout_s = float(args.timeout_s)
    limits = sandbox.Limits(
        wall_s=timeout_s,
        cpu_s=max(1, math.ceil(timeout_s)),
        output_bytes=registry.EXEC_OUTPUT_BYTES,
    )
    try:
        job = builtin.lease_job(ctx, job_id, generation)
    except builtin.ToolFailed:
        job = {}
    layout, variables, env = builtin.sandbox_view(ctx, job)
    result = sandbox.run(
        [SHELL, "-c", args.command],
        ctx.work,
        mode=sandbox_mode(ctx.settings),
        limits=limits,
        hide=[ctx.settings.home],
        env=variables,
        merged=True,
        layout=layout,
    )
    reply: dict[str, Any] = {
        "exit_code": exit_code(result),
        "output": result.stdout,
        "truncated": result.output_truncated,
        "timed_out": result.timed_out,
        "duration_ms": round(result.duration_ms, 1),
        "sandbox": result.mode,
    }
    if result.warning:
        reply["sandbox_warning"] = result.warning
    if env is not None:
        reply["environment"] = env.key
    return reply
