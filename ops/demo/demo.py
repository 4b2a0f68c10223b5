"""``slotrunner demo``: the whole stack on this machine, a few agent jobs, a summary.

Starts what it needs as child processes (the embedded Redis unless REDIS_URL is set,
the tool server, a Celery worker), builds a small git repository with a real
``unittest`` suite, enqueues scripted jobs that patch it and run its tests, shows
progress, then replays one job's buffered apply with its old envelope to show the
fence refusing it, and prints what happened.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ops.demo.sample_repo import init_repo
from runner.core.settings import Settings

CALC_PY = '''"""A tiny calculator with a bug the demo's agent jobs fix."""


def add(a, b):
    return a + b


def mean(values):
    return sum(values) / (len(values) + 1)  # off by one
'''

TEST_CALC_PY = """import unittest

import calc


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)

    def test_mean(self):
        self.assertEqual(calc.mean([1, 2, 3]), 2)


if __name__ == "__main__":
    unittest.main()
"""

FIX_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -6,4 +6,4 @@ def add(a, b):
\x20
\x20
 def mean(values):
-    return sum(values) / (len(values) + 1)  # off by one
+    return sum(values) / len(values)
"""


def make_sample_repo(path: Path) -> str:
    """A git repository with a failing test; returns its HEAD commit."""
    return init_repo(
        path, {"calc.py": CALC_PY, "test_calc.py": TEST_CALC_PY}, "calculator with an off-by-one"
    )


def demo_spec(repo: Path, base: str, index: int, run_id: str) -> dict[str, Any]:
    return {
        "job_id": f"demo-{run_id}-{index:02d}",
        "eval_run": f"demo-{run_id}",
        "repo": str(repo),
        "base": base,
        "test_command": [sys.executable, "-m", "unittest", "-q"],
        "planner": {
            "kind": "scripted",
            "steps": [
                {"tool": "read_file", "args": {"path": "calc.py"}},
                {"tool": "apply_patch", "args": {"patch": FIX_PATCH}},
                {
                    "tool": "write_file",
                    "args": {
                        "path": f"notes/job-{index:02d}.md",
                        "content": f"fixed mean() in job {index}\n",
                    },
                },
                {"tool": "run_tests", "args": {}},
                {"tool": "git_status", "args": {}},
            ],
        },
    }


def _tool_outcomes(log_path: Path, job_ids: set[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    with open(log_path, "rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "tool_result" and record.get("job_id") in job_ids:
                key = record["outcome"]
                if record.get("reason"):
                    key += f" ({record['reason']})"
                counts[key] += 1
    return counts


@click.command()
@click.option(
    "--jobs",
    "n_jobs",
    type=click.IntRange(1, 200),
    default=8,
    show_default=True,
    help="How many agent jobs to run.",
)
@click.option(
    "--planner",
    "planner_kind",
    type=click.Choice(["scripted", "openai"]),
    default="scripted",
    show_default=True,
    help="openai: plan through a local fault-injecting OpenAI-compatible endpoint "
    "(429s, timeouts with late bodies), every request under the admission desk.",
)
@click.option(
    "--incident",
    is_flag=True,
    help="Replay a buffered apply into a recycled slot with the fence off, then on, and compare.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Give up waiting after this many seconds.",
)
def demo(n_jobs: int, planner_kind: str, incident: bool, timeout_s: float) -> None:
    """Run N scripted agent jobs end to end on a local stack and summarise them.

    With --incident: a buffered apply replayed into a recycled slot, once with the envelope
    fence switched off (the write lands, the detector pages, the pool stops, restore
    repairs the victim) and once with it on (refused, nothing to page).
    """
    if incident:
        _incident()
        return
    import uuid

    from ops.testing.stack import free_port, stack_env, start_toolserver, start_worker
    from runner.jobs.submit import submit, wait_for
    from runner.redis_server import connect, resolve_url
    from runner.worker.celery_app import create_app

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    settings = Settings.from_env()
    url = resolve_url(settings)
    port = free_port()
    settings = settings.with_(toolserver_url=f"http://127.0.0.1:{port}", redis_url=url)
    env = stack_env(os.environ, **settings.to_env())
    run_id = uuid.uuid4().hex[:6]
    run_dir = settings.home / "demo" / run_id
    repo = run_dir / "sample-repo"
    base = make_sample_repo(repo)
    console.print(
        f"slotrunner demo [bold]{run_id}[/]: home {settings.home}, Redis {url}, "
        f"{settings.slots} slots, {n_jobs} jobs"
    )
    children = []
    endpoint = None
    try:
        children.append(start_toolserver(env, port, run_dir))
        children.append(start_worker(env, run_dir, concurrency=2))
        app = create_app(settings, redis_url=url)
        client = connect(settings)
        specs = [demo_spec(repo, base, i, run_id) for i in range(n_jobs)]
        if planner_kind == "openai":
            endpoint, base_url = _start_endpoint(specs[0], seed=int(run_id, 16))
            console.print(f"planner: fake OpenAI endpoint {base_url} (429s and late bodies on)")
            specs = [_openai(spec, base_url) for spec in specs]
        ids = [submit(app, client, spec).job_id or "" for spec in specs]
        with Progress(
            TextColumn("jobs"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("jobs", total=n_jobs)
            results = wait_for(
                client,
                ids,
                timeout_s,
                on_progress=lambda done: progress.update(task, completed=len(done)),
            )
        fence = _replay_stale_apply(settings, results.get(ids[0]), ids[0])
    finally:
        for child in reversed(children):
            child.stop()
        if endpoint is not None:
            endpoint.close()
    _summary(console, settings.log_path, ids, results, fence)
    if planner_kind == "openai":
        _planner_summary(console, results)
    if len(results) < n_jobs or any(r.state != "succeeded" for r in results.values()):
        sys.exit(1)


def _start_endpoint(spec: dict[str, Any], seed: int) -> tuple[Any, str]:
    """The demo's model: replays the scripted steps, with rate limits and late bodies."""
    from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
    from ops.testing.fake_endpoint.server import serve

    steps = [ScriptStep(tool=s["tool"], args=s["args"]) for s in spec["planner"]["steps"]]
    steps = [
        s
        if s.tool != "write_file"
        else ScriptStep(
            tool="write_file", args={"path": "notes/agent.md", "content": "fixed mean()\n"}
        )
        for s in steps
    ]
    config = FakeEndpointConfig(
        script=(*steps, ScriptStep(final="mean() fixed; tests pass")),
        seed=seed,
        max_concurrency=1,
        retry_after_s=1,
        hang_prob=0.15,
        hang_s=2.5,
        service_ms_median=30,
        service_ms_p99=200,
    )
    server, port = serve(config)
    return server, f"http://127.0.0.1:{port}/v1"


def _openai(spec: dict[str, Any], base_url: str) -> dict[str, Any]:
    planner = {
        "kind": "openai",
        "base_url": base_url,
        "model": "fake-model",
        "prompt": "Fix mean() in calc.py so the tests pass.",
        "request_timeout_s": 1.0,
        "admission_bound": 2,
    }
    return {**spec, "planner": planner}


def _planner_summary(console: Console, results: dict[str, Any]) -> None:
    totals: Counter[str] = Counter()
    duplicate_commits = 0
    for result in results.values():
        totals.update(result.planner)
        # One commit per planned step plus the final answer; anything more is a duplicate.
        duplicate_commits += max(0, result.planner.get("commits", 0) - (len(result.steps) + 1))
    keys = (
        "requests",
        "commits",
        "timeouts",
        "stale_rejections",
        "http_429",
        "protocol_errors",
        "admission_refused",
    )
    console.print("inference: " + ", ".join(f"{k} {totals.get(k, 0)}" for k in keys))
    console.print(f"duplicate commits: {duplicate_commits}")


def _incident() -> None:
    from ops.demo.incident import render, run

    console = Console()
    console.print("Replaying a buffered apply in a scratch home, twice (about 30 s)...")
    off, on = run()
    console.print(render(off, on))
    ok = (
        not off.victim_intact
        and bool(off.pages)
        and off.restored_tree == off.start_tree
        and on.victim_intact
        and not on.pages
        and on.replay_status == 409
    )
    console.print(
        "the fence held and the detector caught the unfenced write"
        if ok
        else "[bold red]unexpected outcome: see the timelines above[/]"
    )
    if not ok:
        sys.exit(1)


def _replay_stale_apply(settings: Any, first: Any, job_id: str) -> str:
    """The replay of docs/architecture.md §Problem: job 1's apply, resent with its old
    envelope after recycling."""
    from tools.client import ToolClient, ToolRefused
    from tools.envelope import Envelope

    if first is None or first.slot_id is None or first.generation is None:
        return "skipped (the first job has no result)"
    envelope = Envelope(
        job_id=job_id,
        attempt=first.attempt,
        slot_id=first.slot_id,
        generation=first.generation,
        tool="apply_patch",
        idempotency_key=f"{job_id}:replay",
    )
    client = ToolClient(settings.toolserver_url, token=settings.token)
    try:
        client.call(envelope, {"patch": FIX_PATCH}, slot_dir=None, deadline_s=10)
    except ToolRefused as exc:
        return f"refused: {exc.reason}"
    finally:
        client.close()
    return "APPLIED (the fence did not hold!)"


def _summary(
    console: Console, log_path: Path, ids: list[str], results: dict[str, Any], fence: str
) -> None:
    states = Counter(r.state for r in results.values())
    states["unfinished"] = len(ids) - len(results)
    table = Table("state", "slot", "gen", "calls", "replayed", "receipts", "final_tree")
    table.add_column("job", no_wrap=True)
    table.columns.insert(0, table.columns.pop())
    for job_id in ids:
        r = results.get(job_id)
        if r is None:
            table.add_row(job_id, "unfinished", "", "", "", "", "", "")
            continue
        table.add_row(
            job_id,
            r.state,
            r.slot_id or "-",
            str(r.generation or "-"),
            str(r.counts.tool_calls),
            str(r.counts.replayed),
            str(r.counts.receipts),
            (r.final_tree or "")[:12],
        )
    console.print(table)
    console.print("jobs by state: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items()) if v))
    outcomes = _tool_outcomes(log_path, set(ids))
    console.print(
        "tool calls by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    )
    receipts = sum(r.counts.receipts for r in results.values())
    refusals = sum(v for k, v in outcomes.items() if k.startswith("refused"))
    console.print(f"receipts {receipts}, refusals {refusals}")
    console.print(f"replay of job 1's apply with its old envelope: {fence}")
    console.print(f"log: {log_path}")
