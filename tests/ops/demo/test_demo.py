"""`slotrunner demo`, as a new user runs it: the whole stack, real processes, a summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def run_demo(
    tmp_path: Path, redis_url: str, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SLOTRUNNER_HOME": str(tmp_path / "home"),
        "REDIS_URL": redis_url,
        "SLOTRUNNER_HOST_ID": f"demo-{tmp_path.name}",
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_scripted_demo_succeeds_and_shows_the_fence(tmp_path: Path, redis_url: str) -> None:
    """The default demo runs every job to success and shows the stale replay refused."""
    proc = run_demo(tmp_path, redis_url, "--jobs", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs by state: succeeded 3" in proc.stdout
    assert "old envelope: refused: slot_job_mismatch" in proc.stdout


def test_openai_demo_reports_stale_rejections_and_no_duplicate_commits(
    tmp_path: Path, redis_url: str
) -> None:
    """With the fake endpoint's 429s and late bodies on, every job finishes, stale
    completions are reported and no step is committed twice."""
    proc = run_demo(tmp_path, redis_url, "--jobs", "3", "--planner", "openai")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs by state: succeeded 3" in proc.stdout
    assert "duplicate commits: 0" in proc.stdout
    inference = re.search(r"inference: (.*)", proc.stdout)
    assert inference is not None
    counts = dict(re.findall(r"(\w+) (\d+)", inference.group(1)))
    assert int(counts["http_429"]) > 0  # the endpoint's rate limit was really hit
    assert int(counts["commits"]) == 3 * 6  # five steps and a final answer per job


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of the summary table's job rows."""
    return [
        [cell.strip() for cell in line.strip("│ \n").split("│")]
        for line in stdout.splitlines()
        if line.startswith("│ demo-")
    ]


@pytest.mark.parametrize("framework", ["mini-swe-agent", "openai-agents", "mcp"])
def test_each_agent_framework_runs_its_jobs_to_success(
    tmp_path: Path, redis_url: str, framework: str
) -> None:
    """`demo --agent X` on the real stack: every job succeeds with that framework's own
    agent, each on its own repository; the table names the framework beside today's
    columns; the stale replay is still refused."""
    proc = run_demo(tmp_path, redis_url, "--agent", framework, "--jobs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"2 jobs, agent {framework}" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith("┃ job"))
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "job", "framework", "state", "slot", "gen", "calls", "replayed", "receipts", "final_tree",
    ]  # fmt: skip
    rows = table_rows(proc.stdout)
    assert [row[1:3] for row in rows] == [[framework, "succeeded"]] * 2, proc.stdout
    assert all(int(row[5]) > 0 and row[7] == row[5] for row in rows), rows  # a receipt a call
    assert "jobs by state: succeeded 2" in proc.stdout
    assert "old envelope: refused: slot_job_mismatch" in proc.stdout
    if framework == "openai-agents":
        # Three completions a job (the patch, the tests, the answer), each admitted.
        assert "gateway: completed 6\n" in proc.stdout
        seen = re.search(r"most concurrent requests (\d+) \(the run's bound (\d+)\)", proc.stdout)
        assert seen is not None and int(seen.group(1)) <= int(seen.group(2))
