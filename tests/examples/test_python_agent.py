"""examples/python_agent on the real stack: its job spec, as shipped, run by a real
Celery worker against a real tool server, Redis and git, enqueued by `slotrunner submit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from ops.cli import ops
from runner.core.settings import Settings
from runner.jobs.results import load_result
from tests.support.agents import agent_pythonpath
from tests.support.repos import REPO, make_repo
from tests.support.stack import stack
from tests.support.toolserver import child_env

EXAMPLE = REPO / "examples" / "python_agent"
SUBMIT = [sys.executable, "-m", "runner.cli.main", "submit"]


def sample_repo(path: Path) -> str:
    files = {p.name: p.read_text() for p in sorted((EXAMPLE / "sample").iterdir())}
    return make_repo(path, files)


def tree_by_hand(repo: Path, base: str, tmp_path: Path, config: dict[str, str]) -> str:
    """The agent's edit made by hand in a clean checkout, and the tree id git gives it."""
    clone = tmp_path / "by-hand"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", base], cwd=clone, check=True)
    target = clone / config["path"]
    target.write_text(target.read_text().replace(config["find"], config["replace"], 1))
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "hand.index")}
    subprocess.run(["git", "add", "-A"], cwd=clone, env=env, check=True)
    return subprocess.run(
        ["git", "write-tree"], cwd=clone, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_the_example_job_succeeds_with_a_receipt_and_a_log_line_per_call(
    settings: Settings, tmp_path: Path
) -> None:
    """The shipped job.json (its repo pointed at a copy of sample/): succeeded, one
    tool_result line per call, a receipt per mutating call, verify/detect clean, and
    final_tree the tree of the same edit made by hand."""
    spec = json.loads((EXAMPLE / "job.json").read_text())
    repo = tmp_path / "sample"
    spec["repo"], spec["base"] = str(repo), sample_repo(repo)
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    job_id = spec["job_id"]
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        worker = s.worker("w1")
        proc = subprocess.run(
            [*SUBMIT, str(spec_file), "--wait", "--timeout", "120"],
            env=child_env(s.settings, PYTHONPATH=agent_pythonpath()),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr + worker.tail()
        assert f"{job_id}\tsucceeded" in proc.stdout
        result = load_result(s.redis, job_id)
        assert result is not None and result.state == "succeeded", result
        tools = [step.tool for step in result.steps]
        assert tools == ["list_dir", "read_file", "write_file", "exec", "run_tests"]
        assert [step.outcome for step in result.steps] == ["read"] * 2 + ["applied"] * 3
        assert result.counts.tool_calls == 5 and result.counts.receipts == 3
        assert result.counts.stale_rejects == result.counts.replayed == 0
        assert "-    return a - b\n+    return a + b" in result.diff
        assert result.final_tree == tree_by_hand(
            repo, spec["base"], tmp_path, spec["planner"]["config"]
        )
        # One log line per call, each under the job's lease; a receipt per mutating call.
        lines = s.events("tool_result", job_id=job_id)
        assert [line["tool"] for line in lines] == tools
        assert {line["slot_generation"] for line in lines} == {result.generation}
        assert [line["outcome"] for line in lines] == ["read"] * 2 + ["applied"] * 3
        receipts_file = s.settings.slots_dir / str(result.slot_id) / "receipts.jsonl"
        receipts = [json.loads(line) for line in receipts_file.read_text().splitlines()]
        for step in result.steps[2:]:
            assert step.idempotency_key == f"{job_id}:a1:s{step.index}:{step.tool}"
            mine = [r for r in receipts if r["key"] == step.idempotency_key]
            assert [r["status"] for r in mine] == ["intent", "applied"], mine
        assert len(s.events("slot_released", job_id=job_id)) == 1
        for verb in ("verify", "detect"):
            checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
            assert checked.exit_code == 0, (verb, checked.output)
