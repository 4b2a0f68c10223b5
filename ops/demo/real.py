"""``slotrunner demo --real``: agent jobs on a real project, sharing one built environment.

Downloads six's sdist (``ops.demo.six_source``), commits it into a git repository
under the demo's home, starts the same stack as the plain demo (the tool server and a
Celery worker of two processes, as child processes) and submits the jobs of
``ops.demo.real_jobs``. Two jobs start together: one builds the environment, the other
waits for it; the third finds it built. While that happens each job's phase (the Redis
key ``runner.core.keys.job_phase``) and the ``environment_built`` /
``environment_reused`` lines of the host's log are shown as they come
(docs/architecture.md §Environments). The summary judges every job against its plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ops.demo import real_jobs, real_report, six_source
from ops.testing.stack import Child, free_port, stack_env, start_toolserver, start_worker
from runner.core import keys
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.jobs import events as job_events
from runner.jobs.submit import submit, wait_for
from runner.redis_server import connect, resolve_url
from runner.worker.celery_app import create_app

# After the last result, how long the log may take to show every job_finished line.
_LOG_GRACE_S = 15.0


class Watch:
    """Shows the jobs' phases and environment events while the run waits for results."""

    def __init__(
        self, console: Console, client: redis.Redis, log_path: Path, labels: dict[str, str]
    ) -> None:
        self.console = console
        self.client = client
        self.log_path = log_path
        self.labels = labels
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        self.partial = b""
        self.phases: dict[str, str] = {}
        self.prepared: set[str] = set()  # jobs seen at or past their environment
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.tasks = {j: self.progress.add_task(f"{label}: queued") for j, label in labels.items()}

    def __call__(self, done: dict[str, Any]) -> None:
        for record in self._new_records():
            self._event(record)
        for job_id, label in self.labels.items():
            if job_id in done:
                status = f"{done[job_id].state}"
                self.progress.update(self.tasks[job_id], completed=1, total=1)
            else:
                status = self._phase(job_id)
            if status != self.phases.get(job_id):
                self.phases[job_id] = status
                self.progress.update(self.tasks[job_id], description=f"{label}: {status}")
                self.console.print(f"{label}: {status}", markup=False)

    def _phase(self, job_id: str) -> str:
        phase = self.client.get(keys.job_phase(job_id))
        if phase is not None:
            self.prepared.add(job_id)
            return phase.decode() if isinstance(phase, bytes) else str(phase)
        state = self.client.get(keys.job_state(job_id))
        if state is None:
            return "queued"
        text = state.decode() if isinstance(state, bytes) else str(state)
        if text != "running":
            return text
        # Before its environment the job prepares its slot; after it, its steps run.
        return "running its steps" if job_id in self.prepared else "preparing its slot"

    def _event(self, record: dict[str, Any]) -> None:
        label = self.labels[record["job_id"]]
        if record.get("event") == job_events.ENVIRONMENT_BUILT:
            line = f"environment {record['key']} built in {record['build_s']:.1f} s"
        elif record.get("event") == job_events.ENVIRONMENT_REUSED:
            waited = float(record.get("wait_s") or 0)
            line = f"environment {record['key']} reused" + (
                f" after waiting {waited:.1f} s for its build" if waited >= 0.05 else ""
            )
        elif record.get("event") == job_events.ENVIRONMENT_FAILED:
            line = f"environment {record.get('key')} failed: {record.get('error', '')[:300]}"
        else:
            return
        self.prepared.add(record["job_id"])
        self.console.print(f"{label}: {line}", markup=False)

    def _new_records(self) -> list[dict[str, Any]]:
        """Complete lines the log gained since the last look, about these jobs."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        records = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("job_id") in self.labels:
                    records.append(record)
        return records


def run(timeout_s: float) -> bool:
    """Run the demo; True when every job and the environment ended as expected."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # the summary's rows, one line each
    settings = Settings.from_env()
    url = resolve_url(settings)
    port = free_port()
    settings = settings.with_(toolserver_url=f"http://127.0.0.1:{port}", redis_url=url)
    env = stack_env(os.environ, **settings.to_env())
    run_id = uuid.uuid4().hex[:6]
    run_dir = settings.home / "demo" / run_id
    console.print(
        f"slotrunner demo --real [bold]{run_id}[/]: home {settings.home}, Redis {url}, "
        f"{len(real_jobs.PLANS)} jobs on {six_source.REQUIREMENT} sharing one environment"
    )
    console.print(f"downloading {six_source.REQUIREMENT}'s source from the package index ...")
    repo, base = six_source.fetch(run_dir)
    console.print(f"committed it into {repo} at {base[:12]}", markup=False)
    specs = real_jobs.specs(repo, base, run_id)
    ids = [spec["job_id"] for spec in specs]
    labels = {job_id: plan.name for job_id, plan in zip(ids, real_jobs.PLANS, strict=True)}
    children: list[Child] = []
    client = connect(settings)
    try:
        children.append(start_toolserver(env, port, run_dir))
        children.append(start_worker(env, run_dir, concurrency=2))
        app = create_app(settings, redis_url=url)
        watch = Watch(console, client, settings.log_path, labels)
        for spec in specs:
            submit(app, client, spec)
        with watch.progress:
            results = wait_for(client, ids, timeout_s, on_progress=watch)
        seconds = _job_seconds(settings.log_path, set(ids)) if len(results) == len(ids) else None
    finally:
        for child in reversed(children):
            child.stop()
        client.close()
    outcomes = [
        real_report.judge(plan, job_id, results.get(job_id), (seconds or {}).get(job_id))
        for job_id, plan in zip(ids, real_jobs.PLANS, strict=True)
    ]
    env_report = real_report.env_report(outcomes, real_report.read_log(settings.log_path, set(ids)))
    real_report.render(console, outcomes, env_report, settings.log_path)
    return all(o.expected for o in outcomes) and not env_report.problems


def _job_seconds(log_path: Path, job_ids: set[str]) -> dict[str, float] | None:
    """``job_finished`` is logged just after the result's commit: wait for every line."""
    try:
        return poll_until(
            lambda: real_report.job_seconds(real_report.read_log(log_path, job_ids)),
            _LOG_GRACE_S,
            0.1,
            what="every job's job_finished line",
        )
    except PollTimeout:
        return None
