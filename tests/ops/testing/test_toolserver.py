"""The test tool server's seams that the benchmarks use (``ops.testing.toolserver``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.testing.toolserver import NoopEffect
from runner.core.settings import Settings
from tests.support.execslots import Slots, envelope
from tests.support.repos import make_repo
from tools.builtin import sha256
from tools.server.service import ToolService

CONTENT = "x = 1\n"


def receipts(slot_dir: Path, key: str) -> list[dict[str, Any]]:
    lines = (slot_dir / "receipts.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["key"] == key]


def write(service: ToolService, stamp: Any, key: str, path: str) -> Any:
    body = {
        "envelope": envelope(stamp, key, "write_file"),
        "args": {"path": path, "content": CONTENT},
    }
    return service.call("write_file", body)


def test_the_noop_effect_records_write_file_and_leaves_the_tree_alone(
    settings: Settings, tmp_path: Path
) -> None:
    """With NoopEffect a write_file is answered and recorded as the real one is (intent,
    then applied with the content's digest), and no file appears; the same call to a
    service with the real effect writes it. Other tools still run for real."""
    repo = tmp_path / "repo"
    slots = Slots(settings, repo, make_repo(repo))
    try:
        stamp = slots.lease("job-A")
        work, slot_dir = slots.work(stamp), slots.dir(stamp)
        noop, real = ToolService(settings, hooks=NoopEffect()), ToolService(settings)

        reply = write(noop, stamp, "job-A:noop", "pkg/new.py")
        assert reply.http_status == 200 and reply.outcome == "applied"
        assert reply.body["result"] == {
            "path": "pkg/new.py",
            "bytes": len(CONTENT),
            "digest": sha256(CONTENT.encode()),
        }
        assert [r["status"] for r in receipts(slot_dir, "job-A:noop")] == ["intent", "applied"]
        assert not (work / "pkg" / "new.py").exists()

        assert write(real, stamp, "job-A:real", "pkg/new.py").outcome == "applied"
        assert (work / "pkg" / "new.py").read_text() == CONTENT

        body = {"envelope": envelope(stamp, "job-A:rm", "rm"), "args": {"path": "README"}}
        assert noop.call("rm", body).outcome == "applied"
        assert not (work / "README").exists()
    finally:
        slots.close()


def test_a_fault_plan_and_the_noop_effect_together_are_refused(tmp_path: Path) -> None:
    """Both are the server's call hooks: asking for both is a usage error, not a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "ops.testing.toolserver", "--port", "1",
         "--faults", str(tmp_path / "faults"), "--effect", "noop"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--faults and --effect noop cannot be used together" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "faults").exists()
