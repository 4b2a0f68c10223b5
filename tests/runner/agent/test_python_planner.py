"""The ``python`` planner kind on the real stack: entries that cannot run, an agent that
raises, a cancel and a deadline, each through a real Celery worker that imports the
agent (tests/support/agents.py) and a real tool server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.cli import ops
from runner.core import keys
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from runner.jobs.cancel import cancel
from runner.jobs.queue import QUEUE, TASK_NAME
from runner.jobs.submit import submit
from tests.support.agents import agent_pythonpath
from tests.support.stack import Stack, stack, wait_until
from tests.support.toolserver import child_env

BAD_ENTRIES = [
    ("no_such_agent_pkg.agent:run", "module 'no_such_agent_pkg.agent' cannot be imported"),
    ("tests.support.agents:missing", "'tests.support.agents' has no attribute 'missing'"),
    ("tests.support.agents:NOT_CALLABLE", "is not callable (it is a int)"),
    ("tests.support.agents:takes_one", "cannot be called as fn(workspace, config)"),
]


def python_spec(s: Stack, job_id: str, entry: str, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "repo": str(s.repo),
        "base": s.base,
        "planner": {"kind": "python", "entry": entry, "config": extra.pop("config", {})},
        **extra,
    }


def clean_log(s: Stack) -> None:
    for verb in ("verify", "detect"):
        checked = CliRunner().invoke(ops, [verb, str(s.settings.log_path)])
        assert checked.exit_code == 0, (verb, checked.output)


def slots_idle(s: Stack) -> None:
    for slot in s.settings.slots_dir.iterdir():
        stamp = read_stamp(slot)
        assert stamp is None or stamp.state == SlotState.IDLE, stamp


@pytest.mark.parametrize(("entry", "needle"), BAD_ENTRIES)
def test_slotrunner_submit_refuses_an_entry_that_cannot_run(
    settings: Settings, redis_client: Any, tmp_path: Path, entry: str, needle: str
) -> None:
    """`slotrunner submit`: exit 2, the entry and its problem named, nothing enqueued."""
    spec = {"repo": "/x", "planner": {"kind": "python", "entry": entry}}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    queued, jobs = redis_client.llen(QUEUE), redis_client.zcard(keys.JOBS)
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "submit", str(spec_file)],
        env=child_env(settings, PYTHONPATH=agent_pythonpath()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and entry in proc.stderr and "Traceback" not in proc.stderr
    assert "nothing was enqueued" in proc.stderr
    assert redis_client.llen(QUEUE) == queued and redis_client.zcard(keys.JOBS) == jobs


def test_the_worker_rejects_an_entry_that_cannot_run_before_leasing(
    settings: Settings, tmp_path: Path
) -> None:
    """Enqueued with plain Celery (no submit check): each job ends 'rejected' with the
    problem as its reason, and no slot was leased for any of them."""
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        s.worker("w1")
        ids = []
        for number, (entry, _) in enumerate(BAD_ENTRIES):
            spec = python_spec(s, f"py-bad-{number}", entry)
            s.app.send_task(TASK_NAME, args=[spec], queue=QUEUE)
            ids.append(spec["job_id"])
        for job_id, (entry, needle) in zip(ids, BAD_ENTRIES, strict=True):
            result = s.result(job_id)
            assert result.state == "rejected", result
            assert needle in (result.reason or "") and entry in (result.reason or "")
            assert result.slot_id is None and result.steps == []
            assert s.events("slot_leased", job_id=job_id) == []


def test_an_agent_that_raises_fails_its_job_and_releases_its_slot(
    settings: Settings, tmp_path: Path
) -> None:
    """The reason names the exception; the write it made before is applied whole (its
    receipt complete) and in the end snapshot; the slot is released once and idle."""
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        s.worker("w1")
        entry = "tests.support.agents:write_then_raise"
        config = {"path": "notes/before.md", "message": "no fix found"}
        submit(s.app, s.redis, python_spec(s, "py-raises-1", entry, config=config))
        result = s.result("py-raises-1")
        assert result.state == "failed", result
        assert result.reason == f"agent {entry} raised ValueError: no fix found"
        assert [(step.tool, step.outcome) for step in result.steps] == [("write_file", "applied")]
        assert "notes/before.md" in result.diff and result.final_tree is not None
        assert len(s.events("slot_released", job_id="py-raises-1")) == 1
        receipts_file = s.settings.slots_dir / str(result.slot_id) / "receipts.jsonl"
        statuses = [json.loads(line)["status"] for line in receipts_file.read_text().splitlines()]
        assert statuses == ["intent", "applied"]
        slots_idle(s)
        clean_log(s)


@pytest.mark.parametrize(
    ("entry", "config"),
    [
        ("tests.support.agents:poll_until_stopped", {}),
        # Never calls its handle again: the runner does not wait for it.
        ("tests.support.agents:sleep_then_write", {"sleep_s": 600}),
    ],
)
def test_a_cancelled_agent_ends_cancelled_and_its_slot_is_released(
    settings: Settings, tmp_path: Path, entry: str, config: dict[str, Any]
) -> None:
    """A cancel mid-run closes the handle (its next call raises 'cancelled'); the job
    ends 'cancelled', the slot released once, nothing written after the cancel."""
    # Job ids are global to the session's Redis: one per case.
    job_id = "py-cancel-" + entry.rpartition(":")[2].replace("_", "-")
    with stack(settings, tmp_path, PYTHONPATH=agent_pythonpath()) as s:
        s.worker("w1")
        submit(s.app, s.redis, python_spec(s, job_id, entry, config=config))
        leased = s.wait_event("the agent's lease", "slot_leased", job_id=job_id)
        work = s.work(str(leased["slot_id"]))
        wait_until("the agent to start", lambda: (work / "started").exists())
        cancel(s.redis, job_id)
        result = s.result(job_id)
        assert result.state == "cancelled", result
        assert len(s.events("slot_released", job_id=job_id)) == 1
        assert len(s.events("slot_cancel_requested", job_id=job_id)) == 1
        assert not (work / "late.txt").exists()
        assert all(step.outcome == "read" for step in result.steps[1:])
        slots_idle(s)
        clean_log(s)


def test_an_agent_past_its_deadline_fails_the_job(settings: Settings, tmp_path: Path) -> None:
    """An agent that does not return within deadline_s: failed, the deadline named, the
    slot released; its late call is refused."""
    env = {"PYTHONPATH": agent_pythonpath(), "SLOTRUNNER_MIN_DEADLINE_S": "0"}
    with stack(settings, tmp_path, **env) as s:
        s.worker("w1")
        entry = "tests.support.agents:sleep_then_write"
        spec = python_spec(s, "py-late-1", entry, config={"sleep_s": 600}, deadline_s=8)
        submit(s.app, s.redis, spec)
        result = s.result("py-late-1")
        assert result.state == "failed", result
        assert result.reason == f"deadline exceeded: the agent function {entry} had not returned"
        assert [step.tool for step in result.steps] == ["write_file"]
        assert len(s.events("slot_released", job_id="py-late-1")) == 1
        slots_idle(s)
