"""`slotrunner cancel` on the real stack: before dispatch, mid-call, after the end, racing it."""

from __future__ import annotations

import json
from pathlib import Path

from runner.core import keys
from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from tests.support.repos import base_tree
from tests.support.stack import gated_steps, run_cli, stack, wait_until


def cancel_json(settings: Settings, job_id: str) -> dict[str, object]:
    proc = run_cli(settings, "cancel", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_cancel_before_dispatch_leases_nothing(settings: Settings, tmp_path: Path) -> None:
    """A queued job cancelled before any worker took it ends 'cancelled' without a slot."""
    with stack(settings.with_(slots=1), tmp_path) as s:
        s.worker("w1")
        s.submit("busy-1", gated_steps(tail=False))
        s.submit("queued-1", [{"tool": "git_status", "args": {}}])
        s.wait_event("busy-1 to start", "job_started", job_id="busy-1")
        proc = run_cli(s.settings, "cancel", "queued-1")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "queued-1: cancelled before it started"
        again = cancel_json(s.settings, "queued-1")
        assert again["outcome"] == "already_finished" and again["state"] == "cancelled"
        s.open_gate("busy-1", 1)
        assert s.result("busy-1").state == "succeeded"
        # The queued message is still delivered: it finds the result and does nothing.
        s.wait_event("the cancelled job's delivery", "job_already_finished", job_id="queued-1")
        result = s.result("queued-1")
        assert result.state == "cancelled" and result.attempt == 0 and result.slot_id is None
        assert s.events("job_started", job_id="queued-1") == []
        assert s.events("slot_leased", job_id="queued-1") == []


def test_cancel_during_a_tool_call(settings: Settings, tmp_path: Path) -> None:
    """A running job finishes its in-flight call, stops, releases once; the next starts clean."""
    with stack(settings.with_(slots=1), tmp_path) as s:
        s.worker("w1")
        s.submit("running-1", gated_steps())
        leased = s.wait_event("the lease", "slot_leased", job_id="running-1")
        slot = str(leased["slot_id"])
        wait_until("run_tests to start", lambda: (s.work(slot) / "started").exists())
        first = run_cli(s.settings, "cancel", "running-1")
        assert first.returncode == 0 and "cancel requested" in first.stdout, first.stderr
        repeated = cancel_json(s.settings, "running-1")
        assert repeated["outcome"] == "cancel_requested" and repeated["repeated"] is True
        (s.work(slot) / "go").write_text("")
        result = s.result("running-1")
        assert result.state == "cancelled", result.reason
        # The in-flight run_tests finished; the step after it never ran.
        assert [(r.tool, r.outcome) for r in result.steps] == [
            ("write_file", "applied"),
            ("run_tests", "applied"),
        ]
        assert len(s.events("slot_cancel_requested", job_id="running-1")) == 1
        assert len(s.events("slot_released", job_id="running-1")) == 1
        assert [e["committed"] for e in s.events("job_finished", job_id="running-1")] == [True]
        after = run_cli(s.settings, "cancel", "running-1")
        assert after.stdout.strip() == "running-1: already finished: cancelled"
        stamp = read_stamp(s.settings.slots_dir / slot)
        assert stamp is not None and stamp.state == SlotState.IDLE
        # The next job on that slot: a new generation and a fresh tree.
        s.submit("next-1", [{"tool": "git_status", "args": {}}])
        following = s.result("next-1")
        assert following.state == "succeeded", following.reason
        assert following.slot_id == slot and following.generation is not None
        assert following.generation > int(leased["generation"])
        assert following.diff == "" and following.final_tree == base_tree(s.repo, s.base)


def test_cancel_after_completion_and_of_unknown_jobs(settings: Settings, tmp_path: Path) -> None:
    """Cancelling a finished job reports its state, changes nothing; an unknown id is an error."""
    with stack(settings, tmp_path) as s:
        s.worker("w1")
        s.submit("done-1", [{"tool": "git_status", "args": {}}])
        assert s.result("done-1").state == "succeeded"
        proc = run_cli(s.settings, "cancel", "done-1")
        assert proc.returncode == 0 and proc.stdout.strip() == "done-1: already finished: succeeded"
        assert cancel_json(s.settings, "done-1")["outcome"] == "already_finished"
        assert s.result("done-1").state == "succeeded"
        unknown = run_cli(s.settings, "cancel", "never-submitted")
        assert unknown.returncode == 2 and "unknown job 'never-submitted'" in unknown.stderr
        assert "Traceback" not in unknown.stderr
        as_json = run_cli(s.settings, "cancel", "never-submitted", "--json")
        assert as_json.returncode == 2
        assert json.loads(as_json.stdout)["outcome"] == "unknown_job"
        bad = run_cli(s.settings, "cancel", "../etc")
        assert bad.returncode == 2 and "is not a job id" in bad.stderr


def test_cancel_racing_completion_ends_in_one_state(settings: Settings, tmp_path: Path) -> None:
    """A cancel during the last step: exactly one terminal state, one release, one commit."""
    with stack(settings.with_(slots=1), tmp_path) as s:
        s.worker("w1")
        s.submit("race-1", gated_steps(tail=False))
        leased = s.wait_event("the lease", "slot_leased", job_id="race-1")
        slot = str(leased["slot_id"])
        wait_until("run_tests to start", lambda: (s.work(slot) / "started").exists())
        assert cancel_json(s.settings, "race-1")["outcome"] == "cancel_requested"
        (s.work(slot) / "go").write_text("")
        result = s.result("race-1")
        assert result.state in ("succeeded", "cancelled")
        assert s.redis.get(keys.job_state("race-1")) == result.state
        assert [e["committed"] for e in s.events("job_finished", job_id="race-1")] == [True]
        assert len(s.events("slot_released", job_id="race-1")) == 1
        again = cancel_json(s.settings, "race-1")
        assert again == {
            "job_id": "race-1",
            "outcome": "already_finished",
            "state": result.state,
            "repeated": False,
        }
