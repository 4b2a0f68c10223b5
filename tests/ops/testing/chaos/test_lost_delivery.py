"""Regression for chaos seed 15: a superseded delivery's ack must not drop the running copy.

kombu's Redis transport keys unacked deliveries by delivery tag, and a copy restored
after the visibility timeout keeps its tag. So when a paused attempt wakes up,
learns it was superseded and its delivery acks, it also deletes the unacked record
of the copy that runs the newer attempt; if that copy's worker then dies, the
reject-on-worker-lost finds nothing to requeue and the job never ends. The campaign
found it as a pause followed by a SIGKILL on the same job (seed 15, 30 jobs).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from runner.core.settings import Settings
from tests.support.stack import FAST, UNACKED_RESTORE_S, gated_steps, stack, wait_until


@pytest.mark.timeout(180)
def test_job_survives_its_takeover_copy_dying_after_the_zombie_acked(
    settings: Settings, tmp_path: Path
) -> None:
    """Pause attempt 1 until attempt 2 takes over, let 1 end, kill 2: attempt 3 finishes it."""
    with stack(settings.with_(slots=2), tmp_path, UNACKED_RESTORE_S, **FAST) as s:
        s.worker("w1")
        s.worker("w2")
        s.submit("lost-1", gated_steps())
        zombie = s.owner_of("lost-1", 1)
        first = s.wait_event("the first lease", "slot_leased", job_id="lost-1", attempt=1)
        slot1 = str(first["slot_id"])
        wait_until("run_tests to start", lambda: (s.work(slot1) / "started").exists())
        zombie.signal_group(signal.SIGSTOP)
        try:
            s.wait_event("a takeover", "job_started", job_id="lost-1", attempt=2, timeout_s=60)
        finally:
            (s.work(slot1) / "go").write_text("")
            zombie.signal_group(signal.SIGCONT)
        # The zombie learns it was superseded and its delivery ends.
        s.wait_event("the zombie to end", "job_finished", job_id="lost-1", attempt=1)
        second = s.wait_event("the second lease", "slot_leased", job_id="lost-1", attempt=2)
        slot2 = str(second["slot_id"])
        wait_until("attempt 2's run_tests", lambda: (s.work(slot2) / "started").exists())
        runner = s.events("job_started", job_id="lost-1", attempt=2)[0]
        os.kill(int(runner["pid"]), signal.SIGKILL)
        (s.work(slot2) / "go").write_text("")
        s.open_gate("lost-1", 3)
        result = s.result("lost-1")
        assert result.state == "succeeded" and result.attempt == 3, result.reason
