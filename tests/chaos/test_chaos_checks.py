"""The campaign's replay check: what counts as a refused replay and what does not."""

from __future__ import annotations

from typing import Any

from ops.chaos_checks import replays_refused
from ops.chaos_replay import Replayed


def _replay(status: int, error: str | None, n: int = 0) -> Replayed:
    return Replayed(
        f"job-{n}", 1, f"job-{n}:a1:s1:write_file:replay", "slot-0", 3, 4, status, error
    )


def test_fence_refusals_pass() -> None:
    check = replays_refused([_replay(409, "stale_generation", 1), _replay(409, "lease_expired", 2)])
    assert check.ok
    assert check.data == {"fenced": 2, "poisoned": 0}


def test_a_poisoned_slot_refusing_the_replay_passes_and_is_counted_apart() -> None:
    check = replays_refused(
        [_replay(409, "slot_poisoned", 1), _replay(409, "slot_job_mismatch", 2)]
    )
    assert check.ok
    assert check.data == {"fenced": 1, "poisoned": 1}


def test_an_applied_replay_fails() -> None:
    check = replays_refused([_replay(200, None, 1), _replay(409, "stale_generation", 2)])
    assert not check.ok
    assert "job-1" in check.detail


def test_a_refusal_for_another_reason_fails() -> None:
    # a 409 that is neither the fence nor poisoning (e.g. a conflict) does not prove I1
    assert not replays_refused([_replay(409, "conflict", 1)]).ok
    assert not replays_refused([_replay(0, "connect_error", 1)]).ok


def test_attempts_never_repeat_flags_a_reissued_number() -> None:
    from ops.chaos_checks import attempts_never_repeat

    def started(job: str, attempt: int) -> dict[str, Any]:
        return {"event": "job_started", "job_id": job, "attempt": attempt}

    fine: list[dict[str, Any]] = [started("a", 1), started("a", 2), started("b", 1)]
    fine.append({"event": "job_finished"})
    assert attempts_never_repeat(fine).ok
    reissued = [*fine, started("a", 1)]
    check = attempts_never_repeat(reissued)
    assert not check.ok
    assert check.data == {"repeated": {"a": [1]}}
