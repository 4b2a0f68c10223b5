"""What one ``exec`` costs at start-up: the whole tool call against a bare bubblewrap.

Subject: ``ToolClient.call`` of ``exec {"command": "true"}`` to a real tool server
process (envelope check under the slot lock, receipt intent and outcome fsynced, the
rlimits, a pids cgroup, bubblewrap with the slot's layout, ``bash -c true``, the
kill of what it left, the log line); every call a fresh idempotency key. Baseline: a
bare ``bwrap <the sandbox's own mounts> -- bash -c true`` through ``subprocess.run``:
the least a contained command can cost. The bwrap self-test ran at the server's
start, as in production.

Floors (issue #17), measured with both arms, as ``bench/pipeline_floors.py`` does
for ``write_file``; the four arms are called in turn, one call of each at a time
(``bench.stats.alternate_reps``):

- **sandbox floor** (``sandbox.exec_sandbox_floor``): ``tools.sandbox.run.run`` of the
  same command in this process, with the slot's layout and exec's limits: what the
  sandbox itself costs, no tool call around it.
- **call floor** (``sandbox.exec_call_floor``): the same, between a bare httpx POST to
  the no-op server (``bench.noop_server``) and two appends + fsyncs of the slot's own
  last exec intent and outcome: the sandbox plus the fixed cost of any durable tool
  call. The subject is set against this floor.

Goal: the subject costs at most 1.5x the baseline per run (reported, not asserted).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx

from bench.fixtures import Context, lease_slot, make_repo, noop_server, settings_for, toolserver
from bench.pipeline_floors import append_fsync, receipt_lines, verdict
from bench.stats import (
    FLOOR_BOUND,
    Figure,
    Floor,
    Goal,
    Run,
    alternate_reps,
    cost_ratio,
    floor_figure,
    not_measured,
    summarize,
    timed,
)
from tools import registry, shell
from tools.client import ToolClient
from tools.envelope import Envelope
from tools.sandbox import run as sandbox
from tools.sandbox.bwrap import root_entries
from tools.sandbox.layout import slot_layout

NAME = "sandbox.exec_start"
WHAT = "start-up cost of one exec of `true`"
GOAL = Goal("<=", 1.5, "<= 1.5x a bare bwrap run")
BARE_LABEL = "subprocess.run(bwrap <same mounts> -- bash -c true)"
# The breakdown's rows: (arm, what the arm is, what it adds over the row above).
STEPS = (
    ("bare", "bare bwrap (the baseline)", "-"),
    (
        "sandbox",
        "sandbox.run in process (sandbox floor)",
        "the slot's extra binds, rlimits, pids cgroup (joined ahead by a zygote), pipes, kill",
    ),
    ("floor_call", "+ no-op POST + 2 fsyncs (call floor)", "an HTTP round trip, two receipts"),
    (
        "subject",
        "ToolClient -> tool server (the subject)",
        "envelope, lock, stamp, token record, job.json, layout, log line, client, thread hop",
    ),
)


def figure(ctx: Context, reps: int, n: int) -> tuple[list[Figure], list[str]]:
    """The exec figure, its two floors as figures, and notes on how it ran."""
    test = sandbox.self_test()
    if not test.ok or test.bwrap is None:
        return [not_measured(NAME, WHAT, test.detail, GOAL)], []
    work = ctx.dir("exec")
    settings = settings_for(work / "home", ctx.redis_url, sandbox="required", name="exec")
    with contextlib.ExitStack() as stack:
        settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        noop_url, noop = noop_server(work / "logs")
        stack.callback(noop.stop)
        base = make_repo(work / "repo", {"README": "x\n"})
        stamp, slot_dir = lease_slot(settings, work / "repo", base, "bench-exec")
        assert stamp.job_id is not None and stamp.attempt is not None
        client = ToolClient(settings.toolserver_url, timeout_s=60)
        stack.callback(client.close)
        bare_http = httpx.Client(
            base_url=noop_url, timeout=30, transport=httpx.HTTPTransport(retries=0)
        )
        stack.callback(bare_http.close)
        bare = sandbox.bwrap_argv(test.bwrap, slot_dir / "work", root_entries(), [settings.home])
        bare += ["bash", "-c", "true"]
        layout = slot_layout(Path(slot_dir), settings.home)
        limits = sandbox.Limits(wall_s=60.0, cpu_s=60, output_bytes=registry.EXEC_OUTPUT_BYTES)
        calls = 0

        def envelope(key: str) -> Envelope:
            assert stamp.job_id is not None and stamp.attempt is not None
            return Envelope(
                job_id=stamp.job_id,
                attempt=stamp.attempt,
                slot_id=stamp.slot_id,
                generation=stamp.generation,
                tool="exec",
                idempotency_key=key,
            )

        def exec_call(_: int) -> None:
            nonlocal calls
            calls += 1
            response = client.call(
                envelope(f"bench-exec:{calls}"), {"command": "true"}, slot_dir=slot_dir
            )
            if response.result.get("exit_code") != 0 or response.result.get("sandbox") != "bwrap":
                raise RuntimeError(f"exec of true did not run under bwrap: {response.result}")

        def bare_run(_: int) -> None:
            subprocess.run(bare, check=True, stdin=subprocess.DEVNULL, cwd=slot_dir / "work")

        def sandbox_run(_: int) -> None:
            result = sandbox.run(
                [shell.SHELL, "-c", "true"],
                layout.work,
                mode="required",
                limits=limits,
                hide=[settings.home],
                merged=True,
                layout=layout,
            )
            if result.exit_code != 0 or result.mode != "bwrap":
                raise RuntimeError(f"sandbox.run of true failed: {result}")

        timed(3, exec_call)  # the slot's receipts now end with an exec intent and outcome
        timed(3, bare_run)
        timed(3, sandbox_run)
        intent, outcome = receipt_lines(Path(slot_dir))
        fd = os.open(work / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stack.callback(os.close, fd)

        def floor_call(_: int) -> None:
            nonlocal calls
            calls += 1
            body: dict[str, Any] = {
                "envelope": envelope(f"bench-noop:{calls}").model_dump(),
                "args": {"command": "true"},
            }
            bare_http.post("/v1/tools/exec", json=body).raise_for_status()
            append_fsync(fd, intent)
            sandbox_run(0)
            append_fsync(fd, outcome)

        timed(3, floor_call)

        # Call by call (A B C D, D C B A, ...), not block by block: a run costs a few
        # milliseconds, and a block of one arm can meet a slow second of the host (a
        # sync queued behind another, a cgroup's teardown) that its pair's never sees.
        runs = alternate_reps(
            reps,
            n,
            {
                "subject": exec_call,
                "bare": bare_run,
                "sandbox": sandbox_run,
                "floor_call": floor_call,
            },
        )
    ratio, low, high = cost_ratio(runs["subject"], runs["bare"])
    found = Figure(
        name=NAME,
        what=WHAT,
        subject_label="ToolClient -> tool server -> exec {command: true} (receipts, bwrap)",
        baseline_label=BARE_LABEL,
        unit="runs/s",
        subject=summarize(runs["subject"]),
        baseline=summarize(runs["bare"]),
        ratio=ratio,
        ratio_means="exec call time / bare bwrap run time",
        spread=(low, high),
        goal=GOAL,
        floor=call_floor(runs),
    )
    floors = [
        floor_figure(
            f"sandbox.exec_{name}",
            "a floor of exec on this machine vs the same bare bwrap run",
            (label, BARE_LABEL),
            "runs/s",
            (summarize(runs[key]), summarize(runs["bare"])),
            cost_ratio(runs[key], runs["bare"]),
            "floor time per run / bare bwrap time per run (no goal: a floor)",
        )
        for name, key, label in (
            ("sandbox_floor", "sandbox", "sandbox.run(bash -c true) in process, slot layout"),
            ("call_floor", "floor_call", "no-op POST + intent fsync + sandbox.run + outcome fsync"),
        )
    ]
    notes = [
        f"exec: {reps} repetitions of {n} calls per arm, the arms called in turn, one call "
        "of each at a time (subject, bare, sandbox floor, call floor).",
        breakdown(runs),
    ]
    return [found, *floors], notes


def call_floor(runs: dict[str, list[Run]]) -> Floor:
    """The exec figure against the call floor, and in the note against the sandbox's own."""
    arms = {
        "figure": ("subject", "floor_call"),
        "own": ("subject", "sandbox"),
        "value": ("floor_call", "bare"),
        "own_value": ("sandbox", "bare"),
    }
    got = {key: cost_ratio(runs[a], runs[b]) for key, (a, b) in arms.items()}
    own, o_low, o_high = got["own"]
    note = (
        f"against the sandbox floor (sandbox.exec_sandbox_floor, {got['own_value'][0]:.3g}x "
        f"the bare run, no tool call) the subject is at {own:.3g}x (pairs: {o_low:.3g} .. "
        f"{o_high:.3g}); within {FLOOR_BOUND}x: {verdict(own <= FLOOR_BOUND)}"
    )
    what = "no-op POST + intent fsync + in-process sandbox.run of the command + outcome fsync"
    return Floor(
        "sandbox.exec_call_floor",
        what,
        got["value"][0],
        got["figure"][0],
        "exec call time / call floor time",
        spread=got["figure"][1:],
        note=note,
    )


def breakdown(runs: dict[str, list[Run]]) -> str:
    """Where an exec call's time goes: a Markdown table of p50s, each over the row above."""
    p50 = [summarize(runs[arm])["p50_ms"] for arm, _, _ in STEPS]
    steps = ["-", *(f"{b - a:+.3f}" for a, b in itertools.pairwise(p50))]
    table = [
        f"| {label} | {ms:.3f} | {step} | {adds} |"
        for (_, label, adds), ms, step in zip(STEPS, p50, steps, strict=True)
    ]
    head = (
        "Where an exec call's time goes (p50 per call, ms, all repetitions pooled; each "
        "step adds one layer, so the differences are medians' differences):\n\n"
        "| step | p50 ms | over the row above | what the step adds |\n|---|---:|---:|---|\n"
    )
    return head + "\n".join(table)
