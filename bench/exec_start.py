"""What one ``exec`` costs at start-up: the whole tool call against a bare bubblewrap.

Subject: ``ToolClient.call`` of ``exec {"command": "true"}`` to a real tool server
process (envelope check under the slot lock, receipt intent and outcome fsynced, the
limits shim, a pids cgroup, bubblewrap with the slot's layout, ``bash -c true``, the
kill of what it left, the log line); every call a fresh idempotency key. Baseline: a
bare ``bwrap <the sandbox's own mounts> -- bash -c true`` through ``subprocess.run``:
the least a contained command can cost. The arms are interleaved; the bwrap self-test
ran at the server's start, as in production.

Goal: the subject costs at most 1.5x the baseline per run (reported, not asserted).
"""

from __future__ import annotations

import contextlib
import subprocess

from bench.fixtures import Context, lease_slot, make_repo, settings_for, toolserver
from bench.stats import Figure, Goal, cost_ratio, interleave, not_measured, summarize, timed
from tools.client import ToolClient
from tools.envelope import Envelope
from tools.sandbox import run as sandbox
from tools.sandbox.bwrap import root_entries

NAME = "sandbox.exec_start"
WHAT = "start-up cost of one exec of `true`"
GOAL = Goal("<=", 1.5, "<= 1.5x a bare bwrap run")


def figure(ctx: Context, reps: int, n: int) -> tuple[Figure, str]:
    """The exec figure and a note on how it ran."""
    test = sandbox.self_test()
    if not test.ok or test.bwrap is None:
        return not_measured(NAME, WHAT, test.detail, GOAL), ""
    work = ctx.dir("exec")
    settings = settings_for(work / "home", ctx.redis_url, sandbox="required", name="exec")
    with contextlib.ExitStack() as stack:
        settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        base = make_repo(work / "repo", {"README": "x\n"})
        stamp, slot_dir = lease_slot(settings, work / "repo", base, "bench-exec")
        assert stamp.job_id is not None and stamp.attempt is not None
        client = ToolClient(settings.toolserver_url, timeout_s=60)
        stack.callback(client.close)
        bare = sandbox.bwrap_argv(test.bwrap, slot_dir / "work", root_entries(), [settings.home])
        bare += ["bash", "-c", "true"]
        calls = 0

        def exec_call(_: int) -> None:
            nonlocal calls
            calls += 1
            assert stamp.job_id is not None and stamp.attempt is not None
            envelope = Envelope(
                job_id=stamp.job_id,
                attempt=stamp.attempt,
                slot_id=stamp.slot_id,
                generation=stamp.generation,
                tool="exec",
                idempotency_key=f"bench-exec:{calls}",
            )
            response = client.call(envelope, {"command": "true"}, slot_dir=slot_dir)
            if response.result.get("exit_code") != 0 or response.result.get("sandbox") != "bwrap":
                raise RuntimeError(f"exec of true did not run under bwrap: {response.result}")

        def bare_run(_: int) -> None:
            subprocess.run(bare, check=True, stdin=subprocess.DEVNULL, cwd=slot_dir / "work")

        timed(3, exec_call)
        timed(3, bare_run)
        runs = interleave(
            reps, {"exec": lambda _: timed(n, exec_call), "bare": lambda _: timed(n, bare_run)}
        )
    ratio, low, high = cost_ratio(runs["exec"], runs["bare"])
    found = Figure(
        name=NAME,
        what=WHAT,
        subject_label="ToolClient -> tool server -> exec {command: true} (receipts, bwrap)",
        baseline_label="subprocess.run(bwrap <same mounts> -- bash -c true)",
        unit="runs/s",
        subject=summarize(runs["exec"]),
        baseline=summarize(runs["bare"]),
        ratio=ratio,
        ratio_means="exec call time / bare bwrap run time",
        spread=(low, high),
        goal=GOAL,
    )
    return found, f"exec: {reps} repetitions of {n} calls per arm, interleaved."
