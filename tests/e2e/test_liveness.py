"""At-least-once delivery made harmless, on real Celery workers, Redis and tool server.

Redelivery while the first attempt runs, a whole worker SIGKILLed mid-job, and a
worker paused past its heartbeat TTL: each ends with one committed result and every
idempotency key applied once (docs/architecture.md §Job; I1, I2, I7).
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from runner.core.settings import Settings
from runner.core.stamp import read_stamp
from tests.support.stack import FAST, UNACKED_RESTORE_S, Stack, gated_steps, stack, wait_until
from tools.receipts.store import ReceiptStore


def assert_once(s: Stack, job_id: str) -> None:
    """One committed result, and no idempotency key applied twice."""
    # The log line follows the commit that made the result visible: wait for it.
    wait_until(
        "the committed job_finished line",
        lambda: [e for e in s.events("job_finished", job_id=job_id) if e["committed"]] or None,
    )
    committed = [e for e in s.events("job_finished", job_id=job_id) if e["committed"]]
    assert len(committed) == 1, committed
    applied = s.applied_keys(job_id)
    assert applied and max(applied.values()) == 1, applied


def test_redelivered_copy_watches_the_live_attempt(settings: Settings, tmp_path: Path) -> None:
    """A copy redelivered after the visibility timeout watches the live attempt, starts nothing."""
    with stack(settings, tmp_path, UNACKED_RESTORE_S, **FAST) as s:
        s.worker("w1")
        s.worker("w2")
        s.submit("redeliver-1", gated_steps())
        started = s.wait_event("the job to start", "job_started", job_id="redeliver-1")
        # The first attempt is held in run_tests until a copy has been redelivered to
        # the other worker and has found the live heartbeat.
        watchdog = s.wait_event("a redelivered copy to watch", "job_watchdog", job_id="redeliver-1")
        assert watchdog["attempt"] == 1 and watchdog["pid"] != started["pid"]
        s.open_gate("redeliver-1", 1)
        result = s.result("redeliver-1")
        assert result.state == "succeeded" and result.attempt == 1, result.reason
        assert len(s.events("job_started", job_id="redeliver-1")) == 1
        assert len(s.events("slot_leased", job_id="redeliver-1")) == 1
        assert_once(s, "redeliver-1")


def test_whole_worker_killed_resumes_as_a_new_attempt(settings: Settings, tmp_path: Path) -> None:
    """SIGKILL of a worker's whole group: a new attempt resumes it, the old slot is recycled."""
    with stack(settings.with_(slots=1), tmp_path, UNACKED_RESTORE_S, **FAST) as s:
        s.worker("w1")
        s.worker("w2")
        s.submit("killed-1", gated_steps())
        owner = s.owner_of("killed-1", 1)
        first = s.wait_event("the first lease", "slot_leased", job_id="killed-1", attempt=1)
        slot = str(first["slot_id"])
        wait_until("run_tests to start", lambda: (s.work(slot) / "started").exists())
        owner.signal_group(signal.SIGKILL)
        # The tool server finishes the dead attempt's call; the slot lock is then free.
        (s.work(slot) / "go").write_text("")
        s.wait_event("a new attempt", "job_started", job_id="killed-1", attempt=2)
        reclaimed = s.wait_event(
            "the dead attempt's slot to be reclaimed",
            "slot_reclaimed",
            job_id="killed-1",
            attempt=1,
        )
        assert reclaimed["reason"] == "superseded"
        assert reclaimed["generation"] == first["generation"]
        assert reclaimed["new_generation"] > first["generation"]
        s.open_gate("killed-1", 2)
        result = s.result("killed-1")
        assert result.state == "succeeded" and result.attempt == 2, result.reason
        second = s.events("slot_leased", job_id="killed-1", attempt=2)
        assert len(second) == 1 and second[0]["generation"] > reclaimed["new_generation"]
        assert ReceiptStore(s.settings.slots_dir / slot).open_intents() == []
        assert_once(s, "killed-1")


def test_paused_worker_is_superseded_and_fenced(settings: Settings, tmp_path: Path) -> None:
    """SIGSTOP past the heartbeat TTL: a new attempt supersedes the zombie, fenced off for good."""
    with stack(settings.with_(slots=1), tmp_path, UNACKED_RESTORE_S, **FAST) as s:
        s.worker("w1")
        s.worker("w2")
        s.submit("paused-1", gated_steps())
        zombie = s.owner_of("paused-1", 1)
        first = s.wait_event("the first lease", "slot_leased", job_id="paused-1", attempt=1)
        slot = str(first["slot_id"])
        wait_until("run_tests to start", lambda: (s.work(slot) / "started").exists())
        zombie.signal_group(signal.SIGSTOP)
        try:
            s.wait_event("a new attempt", "job_started", job_id="paused-1", attempt=2)
            (s.work(slot) / "go").write_text("")
            s.wait_event(
                "the zombie's slot to be reclaimed",
                "slot_reclaimed",
                job_id="paused-1",
                attempt=1,
            )
            reclaimed_at = len(s.settings.log_path.read_text().splitlines())
        finally:
            zombie.signal_group(signal.SIGCONT)
        s.open_gate("paused-1", 2)
        result = s.result("paused-1")
        assert result.state == "succeeded" and result.attempt == 2, result.reason
        s.wait_event("the zombie to learn it was superseded", "job_superseded", job_id="paused-1")
        # Every call of attempt 1 logged after its slot was reclaimed was refused.
        later = [
            line
            for line in s.settings.log_path.read_text().splitlines()[reclaimed_at:]
            if '"tool_result"' in line and '"attempt": 1' in line and "paused-1" in line
        ]
        assert all('"refused"' in line for line in later), later
        # And a replay of the zombie's envelope is refused by the tool server.
        reply = httpx.post(
            f"{s.server.url}/v1/tools/write_file",
            json={
                "envelope": {
                    "job_id": "paused-1",
                    "attempt": 1,
                    "slot_id": slot,
                    "generation": first["generation"],
                    "tool": "write_file",
                    "idempotency_key": "paused-1:a1:s2:write_file",
                },
                "args": {"path": "notes/b.md", "content": "zombie\n"},
            },
        )
        assert reply.status_code == 409, reply.text
        assert reply.json()["error"] in ("stale_generation", "slot_job_mismatch")
        stamp = read_stamp(s.settings.slots_dir / slot)
        assert stamp is not None and stamp.generation > first["generation"]
        assert_once(s, "paused-1")
        zombie_end = s.events("job_finished", job_id="paused-1", attempt=1)
        assert [e["committed"] for e in zombie_end] == [False]
