"""Backpressure on the real stack: a job that cannot get a slot or time is refused, and counted."""

from __future__ import annotations

from pathlib import Path

from runner.core.settings import Settings
from runner.jobs.backpressure import rejection_counts
from tests.support.stack import gated_steps, run_cli, stack


def test_no_free_slot_or_too_little_deadline_is_rejected(
    settings: Settings, tmp_path: Path
) -> None:
    """1 slot: a second job past its slot wait, and a job with no time left, end 'rejected'."""
    with stack(settings.with_(slots=1), tmp_path, SLOTRUNNER_SLOT_WAIT_S="1") as s:
        s.worker("w1", concurrency=2)
        before = rejection_counts(s.redis)
        s.submit("holder-1", gated_steps(tail=False))
        s.wait_event("the only slot to be leased", "slot_leased", job_id="holder-1")
        s.submit("waiter-1", [{"tool": "git_status", "args": {}}])
        waiter = s.result("waiter-1")
        assert waiter.state == "rejected" and (waiter.reason or "").startswith("no_slot:")
        s.submit("late-1", [{"tool": "git_status", "args": {}}], deadline_s=2)
        late = s.result("late-1")
        assert late.state == "rejected" and (late.reason or "").startswith("deadline:")
        after = rejection_counts(s.redis)
        assert after["no_slot"] == before["no_slot"] + 1
        assert after["deadline"] == before["deadline"] + 1
        assert s.events("slot_leased", job_id="waiter-1") == []
        assert s.events("slot_leased", job_id="late-1") == []
        shown = run_cli(s.settings, "result", "waiter-1")
        assert shown.returncode == 1 and "no_slot" in shown.stdout
        s.open_gate("holder-1", 1)
        assert s.result("holder-1").state == "succeeded"
