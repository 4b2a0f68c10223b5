"""The worker's periodic janitor on the real stack: no job needs to arrive for it to run."""

from __future__ import annotations

import json
from pathlib import Path

from runner.core.settings import Settings
from runner.core.stamp import SlotState, read_stamp
from tests.support.stack import FAST, run_cli, stack


def test_idle_worker_recycles_an_expired_silent_lease(settings: Settings, tmp_path: Path) -> None:
    """A lease whose holder never heartbeats is reclaimed after expiry by an idle worker."""
    with stack(settings.with_(slots=1), tmp_path, **FAST) as s:
        s.worker("w1")
        proc = run_cli(
            s.settings.with_(lease_ttl_s=1.0), "slots", "lease", "--job", "by-hand-1", "--json"
        )
        assert proc.returncode == 0, proc.stderr
        leased = json.loads(proc.stdout)
        reclaimed = s.wait_event("the janitor", "slot_reclaimed", job_id="by-hand-1")
        assert reclaimed["reason"] == "lease_expired"
        assert reclaimed["generation"] == leased["generation"]
        stamp = read_stamp(s.settings.slots_dir / leased["slot_id"])
        assert stamp is not None and stamp.state == SlotState.IDLE
        assert stamp.generation == reclaimed["new_generation"] > leased["generation"]
