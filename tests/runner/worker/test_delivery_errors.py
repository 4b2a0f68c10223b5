"""A delivery that fails outside the job's own handling is retried, never lost.

The failure is the one a disk gives: the worker obeys a fault plan
(``ops.testing.faultplan``, through the test worker ``ops.testing.worker``) that makes
every fsync in ``$SLOTRUNNER_HOME/attempts`` fail with EIO, so the attempt floor
cannot record the claim and ``run_job`` raises before any work. Celery would ack that
delivery and the job would never get a result.
"""

from __future__ import annotations

from pathlib import Path

from ops.testing.faultplan import FaultPlan
from runner.core import keys
from runner.core.settings import Settings
from runner.worker.attempt_floor import ATTEMPTS_DIR
from tests.support.stack import stack, wait_until

STEPS = [{"tool": "write_file", "args": {"path": "out.txt", "content": "done\n"}}]
FAST = {"SLOTRUNNER_DELIVERY_RETRY_S": "0.5"}


def _break_floor(settings: Settings, tmp_path: Path) -> tuple[FaultPlan, Path]:
    attempts = settings.home / ATTEMPTS_DIR
    attempts.mkdir(parents=True, exist_ok=True)
    faults = FaultPlan(tmp_path / "faults")
    faults.arm_fsync_eio(attempts)
    return faults, attempts


def test_a_failed_delivery_is_retried_until_the_cause_is_gone(
    settings: Settings, tmp_path: Path
) -> None:
    with stack(settings, tmp_path, **FAST) as s:
        faults, attempts = _break_floor(s.settings, tmp_path)
        s.worker("w1", faults=faults)
        s.submit("retried-1", STEPS)
        # Each failed claim burns its attempt number; two burnt = a retried delivery.
        wait_until(
            "a delivery to fail and be retried",
            lambda: int(s.redis.get(keys.job_attempt("retried-1")) or 0) >= 2 or None,
        )
        faults.disarm_fsync_eio(attempts)
        result = s.result("retried-1")
        assert result.state == "succeeded", result.reason
        assert result.attempt >= 2  # the failed claims burnt their numbers, none reused


def test_past_the_retry_budget_the_job_fails_with_the_error(
    settings: Settings, tmp_path: Path
) -> None:
    with stack(settings, tmp_path, SLOTRUNNER_DELIVERY_RETRY_S="0.2") as s:
        faults, _ = _break_floor(s.settings, tmp_path)
        s.worker("w1", faults=faults)
        s.submit("given-up-1", STEPS)
        result = s.result("given-up-1", timeout_s=90.0)
        assert result.state == "failed"
        assert result.reason is not None and "in 6 deliveries" in result.reason
        assert "could not be made durable" in result.reason
