"""examples/mcp_client.py runs as written against a real tool server and a real lease."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner.core import events
from tests.support.repos import REPO, make_repo
from tests.support.toolserver import ToolServer, child_env

EXAMPLE = REPO / "examples" / "mcp_client.py"


def test_the_mcp_client_example_leases_lists_calls_and_releases(
    toolserver: ToolServer, tmp_path: Path
) -> None:
    """The example's output names the tools and reads back what it wrote; its lease is gone."""
    make_repo(tmp_path / "repo")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "repo"), "--job", "job-example"],
        env=child_env(toolserver.settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("tools: read_file, list_dir") and "write_file" in lines[1]
    assert lines[-2] == "read_file: hi" and lines[-1].endswith("the token is dead")
    log = [json.loads(line) for line in toolserver.settings.log_path.read_text().splitlines()]
    applied = [e for e in log if e["event"] == events.TOOL_RESULT and e["outcome"] == "applied"]
    assert [(e["tool"], e["idempotency_key"]) for e in applied] == [("write_file", "hello-1")]
    assert [e["job_id"] for e in log if e["event"] == events.SLOT_RELEASED] == ["job-example"]
