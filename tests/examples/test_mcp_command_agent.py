"""examples/mcp_command_agent on the real stack: its job spec, as shipped, run by a real
Celery worker that starts the agent (``python3``, found on the agent's PATH) against a
real tool server's MCP door, Redis and git, enqueued by `slotrunner submit`."""

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

EXAMPLE = REPO / "examples" / "mcp_command_agent"
SAMPLE = REPO / "examples" / "python_agent" / "sample"
SUBMIT = [sys.executable, "-m", "runner.cli.main", "submit"]
FIX = "def add(a, b):\n    return a + b\n"


def tree_by_hand(repo: Path, base: str, tmp_path: Path) -> str:
    """The agent's write made by hand in a clean checkout, and the tree id git gives it."""
    clone = tmp_path / "by-hand"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", base], cwd=clone, check=True)
    (clone / "calc.py").write_text(FIX)
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "hand.index")}
    subprocess.run(["git", "add", "-A"], cwd=clone, env=env, check=True)
    return subprocess.run(
        ["git", "write-tree"], cwd=clone, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_the_example_job_succeeds_with_a_receipt_and_a_log_line_per_call(
    settings: Settings, tmp_path: Path
) -> None:
    """The shipped job.json (its repo pointed at a copy of the sample): succeeded, the
    agent's two MCP calls its steps, each with a log line and a receipt under the job's
    lease, verify/detect clean, and final_tree the tree of the same write made by hand."""
    spec = json.loads((EXAMPLE / "job.json").read_text())
    assert spec["planner"]["argv"][0] == "python3"
    repo = tmp_path / "sample"
    files = {p.name: p.read_text() for p in sorted(SAMPLE.iterdir())}
    spec["repo"], spec["base"] = str(repo), make_repo(repo, files)
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    job_id = spec["job_id"]
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        worker = s.worker("w1")
        proc = subprocess.run(
            [*SUBMIT, str(spec_file), "--wait", "--timeout", "120"],
            env=child_env(s.settings),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr + worker.tail()
        assert f"{job_id}\tsucceeded" in proc.stdout
        result = load_result(s.redis, job_id)
        assert result is not None and result.state == "succeeded", result
        assert result.agent is not None and result.agent["exit_code"] == 0
        assert '"passed": true' in result.agent["output"]  # what the agent printed
        keys = [f"{job_id}:a1:fix", f"{job_id}:a1:tests"]
        assert [(st.tool, st.outcome, st.idempotency_key) for st in result.steps] == [
            ("write_file", "applied", keys[0]),
            ("run_tests", "applied", keys[1]),
        ]
        assert result.counts.tool_calls == 2 and result.counts.receipts == 2
        assert "-    return a - b\n+    return a + b" in result.diff
        assert result.final_tree == tree_by_hand(repo, spec["base"], tmp_path)
        lines = s.events("tool_result", job_id=job_id)
        assert [(line["tool"], line["idempotency_key"]) for line in lines] == [
            ("write_file", keys[0]),
            ("run_tests", keys[1]),
        ]
        assert {line["slot_generation"] for line in lines} == {result.generation}
        receipts_file = s.settings.slots_dir / str(result.slot_id) / "receipts.jsonl"
        receipts = [json.loads(line) for line in receipts_file.read_text().splitlines()]
        for key in keys:
            assert [r["status"] for r in receipts if r["key"] == key] == ["intent", "applied"]
        assert len(s.events("slot_released", job_id=job_id)) == 1
        for verb in ("verify", "detect"):
            checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
            assert checked.exit_code == 0, (verb, checked.output)
