"""`slotrunner demo`, as a new user runs it: the whole stack, real processes, a summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def run_demo(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SLOTRUNNER_HOME": str(tmp_path / "home"),
        "REDIS_URL": redis_url,
        "SLOTRUNNER_HOST_ID": f"demo-{tmp_path.name}",
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
