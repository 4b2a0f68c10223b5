"""``slotrunner demo``: the whole stack on this machine, a few agent jobs, a summary.

Starts what it needs as child processes (the embedded Redis unless REDIS_URL is set,
the tool server, a Celery worker), builds a small git repository with a real
``unittest`` suite, enqueues scripted jobs that patch it and run its tests, shows
progress, then replays one job's buffered apply with its old envelope to show the
fence refusing it, and prints what happened.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ops.demo.agents import FRAMEWORKS, AgentStack, check, make_specs
from ops.demo.sample_repo import init_repo
from ops.demo.summary import summary
from runner.cli.common import FiniteFloat
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


@click.command()
@click.option(
    "--jobs",
    "n_jobs",
    type=click.IntRange(1, 200),
    default=None,
    help="How many agent jobs to run.  [default: 8; 3 with --agent]",
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
    "--agent",
    "framework",
    type=click.Choice(list(FRAMEWORKS)),
    default=None,
    help="Run each job with that framework's own agent, offline, on its example "
    "(examples/): mini-swe-agent: its DefaultAgent and deterministic model, bash as "
    "fenced exec calls; openai-agents: the Agents SDK over MCP, its model the fake "
    "endpoint through the admission gateway; mcp: the official mcp client as a "
    "command agent. Needs a source checkout and the agents extra.",
)
@click.option(
    "--incident",
    is_flag=True,
    help="Replay a buffered apply into a recycled slot with the fence off, then on, and compare.",
)
@click.option(
    "--real",
    is_flag=True,
    help="Run three jobs on a real project (six's source, downloaded from the package "
    "index) that share one built environment (a venv with pytest): one runs the tests, "
    "one breaks byte2int (its tests fail, as expected), one breaks and fixes it. Shows "
    "the build, then whether each job built or reused it. Needs the package index.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(min=0),
    default=300.0,
    show_default=True,
    help="Give up waiting after this many seconds.",
)
def demo(
    n_jobs: int | None,
    planner_kind: str,
    framework: str | None,
    incident: bool,
    real: bool,
    timeout_s: float,
) -> None:
    """Run N scripted agent jobs end to end on a local stack and summarise them.

    With --agent: each job is that framework's agent instead (docs/architecture.md
    §Agents), and the summary names it.

    With --incident: a buffered apply replayed into a recycled slot, once with the envelope
    fence switched off (the write lands, the detector pages, the pool stops, restore
    repairs the victim) and once with it on (refused, nothing to page).

    With --real: jobs on six's real source sharing one environment, built once
    (docs/architecture.md §Environments); exit 1 unless each ends as its plan expects.
    """
    if framework is not None and (incident or planner_kind != "scripted"):
        raise click.UsageError("--agent takes neither --planner nor --incident")
    if real:
        if framework is not None or incident or planner_kind != "scripted" or n_jobs is not None:
            raise click.UsageError("--real takes none of --agent, --incident, --planner, --jobs")
        from ops.demo.real import run as run_real

        if not run_real(timeout_s):
            sys.exit(1)
        return
    if incident:
        _incident()
        return
    n_jobs = n_jobs or (3 if framework else 8)
    agents = None
    if framework is not None:
        agents = AgentStack(check(framework))
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
    if agents is None:
        repo = run_dir / "sample-repo"
        base = make_sample_repo(repo)
        specs = [demo_spec(repo, base, i, run_id) for i in range(n_jobs)]
    else:
        specs = make_specs(agents.framework, run_dir, run_id, n_jobs)
    console.print(
        f"slotrunner demo [bold]{run_id}[/]: home {settings.home}, Redis {url}, "
        f"{settings.slots} slots, {n_jobs} jobs" + (f", agent {framework}" if framework else "")
    )
    children = []
    endpoint = None
    agent_lines: list[str] = []
    try:
        client = connect(settings)
        if agents is not None:
            agents.start(settings, client, specs)
            console.print(agents.describe())
        children.append(start_toolserver(env, port, run_dir))
        worker_env = {**env, **agents.env} if agents is not None else env
        children.append(start_worker(worker_env, run_dir, concurrency=2))
        app = create_app(settings, redis_url=url)
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
        if agents is not None:
            agent_lines = agents.report()
    finally:
        for child in reversed(children):
            child.stop()
        if endpoint is not None:
            endpoint.close()
        if agents is not None:
            agents.stop()
    summary(console, settings.log_path, ids, results, fence, framework)
    if planner_kind == "openai":
        _planner_summary(console, results)
    for line in agent_lines:
        console.print(line, markup=False)
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
