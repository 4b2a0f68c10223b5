"""A job end to end on the real stack: Celery worker, Redis broker, tool server, git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.testing.stack import Child, start_worker
from runner.core import keys
from runner.core.settings import Settings
from runner.jobs.models import JobResult
from runner.jobs.queue import QUEUE
from runner.jobs.submit import submit, wait_for
from runner.worker.celery_app import create_app
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer, child_env

PATCH = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "A"
"""

TEST_PY = """import unittest


class T(unittest.TestCase):
    def test_ok(self):
        import pkg.lock
        self.assertEqual(pkg.lock.held_by, 'A')
"""


@pytest.fixture
def stack(toolserver: ToolServer, tmp_path: Path) -> Iterator[tuple[Settings, Child]]:
    settings = toolserver.settings
    worker = start_worker(child_env(settings), tmp_path / "logs", concurrency=1)
    try:
        yield settings, worker
    finally:
        worker.stop()


def spec(repo: Path, base: str, job_id: str, **extra: Any) -> dict[str, Any]:
    body = {
        "job_id": job_id,
        "repo": str(repo),
        "base": base,
        "test_command": [sys.executable, "-m", "unittest", "-q"],
        "planner": {
            "kind": "scripted",
            "steps": [
                {"tool": "read_file", "args": {"path": "pkg/lock.py"}},
                {"tool": "apply_patch", "args": {"patch": PATCH}},
                {"tool": "write_file", "args": {"path": "notes/by-agent.md", "content": "hello\n"}},
                {"tool": "run_tests", "args": {}},
            ],
        },
    }
    body.update(extra)
    return body


def tree_by_hand(repo: Path, base: str, tmp_path: Path) -> str:
    """Apply the same change to the base by hand and compute the tree id git gives it."""
    clone = tmp_path / "by-hand"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", base], cwd=clone, check=True)
    subprocess.run(["git", "apply", "-"], cwd=clone, input=PATCH.encode(), check=True)
    (clone / "notes").mkdir()
    (clone / "notes" / "by-agent.md").write_text("hello\n")
    # run_tests may leave caches; the job's snapshot excludes nothing it did not write,
    # so the by-hand tree comes from the same files: compare after cleaning bytecode.
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "hand.index")}
    subprocess.run(["git", "add", "-A"], cwd=clone, env=env, check=True)
    return subprocess.run(
        ["git", "write-tree"], cwd=clone, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_job_runs_end_to_end_on_a_real_worker(
    stack: tuple[Settings, Child], tmp_path: Path
) -> None:
    """A scripted job runs on a Celery worker; final_tree equals the by-hand tree."""
    settings, worker = stack
    repo = tmp_path / "repo"
    base = make_repo(
        repo, {"pkg/__init__.py": "", "pkg/lock.py": "held_by = None\n", "test_lock.py": TEST_PY}
    )
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    job = submit(app, client, spec(repo, base, "e2e-1"))
    results = wait_for(client, [job.job_id or ""], timeout_s=90)
    assert "e2e-1" in results, worker.tail()
    result = results["e2e-1"]
    assert result.state == "succeeded", result.model_dump_json(indent=1)
    assert [s.outcome for s in result.steps] == ["read", "applied", "applied", "applied"]
    assert result.final_tree == tree_by_hand(repo, base, tmp_path)
    assert '+held_by = "A"' in result.diff and "notes/by-agent.md" in result.diff
    assert result.counts.tool_calls == 4 and result.counts.receipts == 3
    assert result.generation is not None and result.slot_id is not None
    # The slot went back to the pool exactly once.
    events = [json.loads(line) for line in settings.log_path.read_text().splitlines()]
    released = [e for e in events if e["event"] == "slot_released" and e["job_id"] == "e2e-1"]
    assert len(released) == 1


def test_failed_tests_fail_the_job(stack: tuple[Settings, Child], tmp_path: Path) -> None:
    """A job whose run_tests fails ends 'failed' with the reason, and still releases its slot."""
    settings, worker = stack
    repo = tmp_path / "repo"
    base = make_repo(
        repo, {"pkg/__init__.py": "", "pkg/lock.py": "held_by = None\n", "test_lock.py": TEST_PY}
    )
    body = spec(repo, base, "e2e-fail")
    body["planner"]["steps"] = [{"tool": "run_tests", "args": {}}]
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    submit(app, client, body)
    result = wait_for(client, ["e2e-fail"], timeout_s=90).get("e2e-fail")
    assert result is not None, worker.tail()
    assert result.state == "failed" and "tests failed" in (result.reason or "")


def test_a_job_narrowed_to_some_tools_is_refused_the_others(
    stack: tuple[Settings, Child], tmp_path: Path
) -> None:
    """The spec's tools bind the job's lease: a step calling another tool is refused."""
    settings, worker = stack
    repo = tmp_path / "repo"
    base = make_repo(repo, {"pkg/lock.py": "held_by = None\n"})
    body = spec(repo, base, "e2e-narrow", tools=["read_file", "write_file"])
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    submit(app, client, body)
    result = wait_for(client, ["e2e-narrow"], timeout_s=90).get("e2e-narrow")
    assert result is not None, worker.tail()
    assert [s.outcome for s in result.steps] == ["read", "refused"], result.steps
    assert result.state == "failed" and "tool_not_allowed" in (result.steps[1].detail or "")
    assert "held_by = None" in (repo / "pkg/lock.py").read_text() and not result.diff


def run_cli(
    settings: Settings, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.cli.main", *args],
        env=child_env(settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_submit_wait_and_result(stack: tuple[Settings, Child], tmp_path: Path) -> None:
    """`slotrunner submit --wait` then `slotrunner result --json` report the same result."""
    settings, worker = stack
    repo = tmp_path / "repo"
    base = make_repo(
        repo, {"pkg/__init__.py": "", "pkg/lock.py": "held_by = None\n", "test_lock.py": TEST_PY}
    )
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec(repo, base, "cli-1")))
    proc = run_cli(settings, "submit", str(spec_file), "--wait", "--timeout", "90")
    assert proc.returncode == 0, proc.stderr + worker.tail()
    assert "cli-1\tsucceeded" in proc.stdout
    shown = run_cli(settings, "result", "cli-1", "--json")
    assert shown.returncode == 0
    assert JobResult.model_validate(json.loads(shown.stdout)).state == "succeeded"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"repo": "/x", "planner": {"kind": "scripted", "steps": []}}', "planner.scripted.steps"),
        ('{"repo": "/x", "planner": {"kind": "magic"}}', "planner"),
        (
            '{"job_id": "../evil", "repo": "/x", '
            '"planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]}}',
            "job_id",
        ),
        ('{"planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]}}', "repo"),
        ("{not json", "not JSON"),
        ("[]", "no job spec"),
    ],
)
def test_malformed_spec_enqueues_nothing(
    settings: Settings, tmp_path: Path, content: str, needle: str
) -> None:
    """A bad spec: exit 2, the field named, nothing enqueued and no job recorded."""
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    queued_before = client.llen(QUEUE)
    jobs_before = client.zcard(keys.JOBS)
    spec_file = tmp_path / "bad.json"
    spec_file.write_text(content)
    proc = run_cli(settings, "submit", str(spec_file))
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert client.llen(QUEUE) == queued_before and client.zcard(keys.JOBS) == jobs_before


def test_batch_with_one_bad_spec_enqueues_none(settings: Settings, tmp_path: Path) -> None:
    """A list of specs with one invalid entry enqueues none of them."""
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    good = {
        "job_id": "batch-good",
        "repo": "/x",
        "planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]},
    }
    bad = {"job_id": "batch-bad", "repo": "/x", "planner": {"kind": "scripted"}}
    spec_file = tmp_path / "batch.json"
    spec_file.write_text(json.dumps([good, bad]))
    proc = run_cli(settings, "submit", str(spec_file))
    assert proc.returncode == 2 and "spec 2" in proc.stderr
    assert client.get(keys.job_state("batch-good")) is None


def test_result_of_unknown_job_is_a_clear_error(settings: Settings) -> None:
    """`slotrunner result` on an unknown id exits 2 and says so."""
    proc = run_cli(settings, "result", "never-submitted")
    assert proc.returncode == 2 and "no job 'never-submitted'" in proc.stderr
