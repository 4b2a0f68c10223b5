"""SLOTRUNNER_SANDBOX through the real tool server when bwrap is missing from PATH."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import redis

from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.builtin import write_job


def path_without_bwrap(tmp_path: Path) -> str:
    """A PATH holding git (the tools need it) and nothing else: no bwrap."""
    bin_dir = tmp_path / "bin-no-bwrap"
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    return str(bin_dir)


def start(settings: Settings, tmp_path: Path, mode: str) -> tuple[ToolServer, dict[str, Any], Path]:
    settings = settings.with_(sandbox=mode)
    server = ToolServer(settings, tmp_path / "logs", PATH=path_without_bwrap(tmp_path))
    repo = tmp_path / "repo"
    base = make_repo(repo)
    pool = SlotPool(
        server.settings, redis.Redis.from_url(settings.redis_url or ""), EventLog(server.settings)
    )
    stamp = pool.lease("job-A", 1)
    slot_dir = settings.slots_dir / stamp.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, "job-A")
    write_job(
        slot_dir,
        {
            "job_id": "job-A",
            "generation": stamp.generation,
            "test_command": [os.path.realpath("/usr/bin/python3"), "-c", "print('hi')"],
            "test_timeout_s": 30,
        },
    )
    env = {
        "job_id": "job-A",
        "attempt": 1,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
    }
    return server, env, slot_dir


def call(
    server: ToolServer, env: dict[str, Any], tool: str, args: dict[str, Any], key: str | None
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/tools/{tool}",
        timeout=60,
        json={"envelope": {**env, "tool": tool, "idempotency_key": key}, "args": args},
    )


def test_required_without_bwrap_refuses_run_tests_only(settings: Settings, tmp_path: Path) -> None:
    """required + no bwrap: run_tests fails naming the package; other tools still work."""
    server, env, _ = start(settings, tmp_path, "required")
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["sandbox_mode"] == "required" and health["sandbox"]["ok"] is False
        response = call(server, env, "run_tests", {}, "k-tests")
        receipt = response.json()["receipt"]
        assert receipt["status"] == "failed"
        assert "bubblewrap" in receipt["detail"]
        read = call(server, env, "read_file", {"path": "README"}, None)
        assert read.status_code == 200 and read.json()["result"]["content"] == "sample\n"
        write = call(server, env, "write_file", {"path": "b.txt", "content": "y"}, "k-write")
        assert write.json()["receipt"]["status"] == "applied"
    finally:
        server.stop()


def test_auto_without_bwrap_runs_warns_and_records_the_mode(
    settings: Settings, tmp_path: Path
) -> None:
    """auto + no bwrap: run_tests runs unsandboxed, says so, and the log line records it."""
    server, env, _ = start(settings, tmp_path, "auto")
    try:
        response = call(server, env, "run_tests", {}, "k-tests")
        result = response.json()["result"]
        assert result["passed"] is True and result["stdout"].strip() == "hi"
        assert result["sandbox"] == "none" and result["sandbox_warning"]
        lines = [json.loads(line) for line in server.settings.log_path.read_text().splitlines()]
        line = [entry for entry in lines if entry.get("tool") == "run_tests"][-1]
        assert line["sandbox"] == "none" and "sandbox_warning" in line
    finally:
        server.stop()


def test_required_with_bwrap_records_bwrap(toolserver: ToolServer, tmp_path: Path) -> None:
    """With bwrap present, run_tests runs in it and the receipt and the log say 'bwrap'."""
    settings = toolserver.settings
    repo = tmp_path / "repo"
    base = make_repo(repo)
    pool = SlotPool(settings, redis.Redis.from_url(settings.redis_url or ""), EventLog(settings))
    stamp = pool.lease("job-A", 1)
    slot_dir = settings.slots_dir / stamp.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, "job-A")
    write_job(
        slot_dir,
        {
            "job_id": "job-A",
            "generation": stamp.generation,
            "test_command": ["/bin/sh", "-c", "test -f README"],
            "test_timeout_s": 30,
        },
    )
    env = {
        "job_id": "job-A",
        "attempt": 1,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
    }
    response = call(toolserver, env, "run_tests", {}, "k-tests")
    assert response.json()["result"]["sandbox"] == "bwrap"
    assert response.json()["receipt"]["result"]["sandbox"] == "bwrap"
    lines = [json.loads(line) for line in settings.log_path.read_text().splitlines()]
    assert [e for e in lines if e.get("tool") == "run_tests"][-1]["sandbox"] == "bwrap"
