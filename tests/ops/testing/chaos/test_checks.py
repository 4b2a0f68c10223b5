"""The campaign's replay check: what counts as a refused replay and what does not."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ops.testing.chaos.checks import receipts_i2, replays_refused
from ops.testing.chaos.replay import Replayed
from tests.ops.detect.receipts_home import applied, make_home
from tools.receipts.store import ReceiptStore


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
    from ops.testing.chaos.checks import attempts_never_repeat

    def started(job: str, attempt: int) -> dict[str, Any]:
        return {"event": "job_started", "job_id": job, "attempt": attempt}

    fine: list[dict[str, Any]] = [started("a", 1), started("a", 2), started("b", 1)]
    fine.append({"event": "job_finished"})
    assert attempts_never_repeat(fine).ok
    reissued = [*fine, started("a", 1)]
    check = attempts_never_repeat(reissued)
    assert not check.ok
    assert check.data == {"repeated": {"a": [1]}}


def test_worktrees_check_flags_foreign_and_stale_worktrees(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from ops.testing.chaos.checks import worktrees
    from runner.core.settings import Settings

    home = tmp_path / "home"
    cache = home / "repos" / "r.git"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def git(*args: str) -> None:
        subprocess.run(["git", *args], check=True, capture_output=True, env=env)

    src = tmp_path / "src"
    git("init", "-q", str(src))
    (src / "f").write_text("x\n")
    git("-C", str(src), "add", "f")
    git("-C", str(src), "commit", "-q", "-m", "base")
    git("clone", "-q", "--bare", str(src), str(cache))
    git("-C", str(cache), "worktree", "add", "-q", "--detach", str(home / "slots/S0/work"))
    settings = Settings.from_env(
        {"SLOTRUNNER_HOME": str(home), "SLOTRUNNER_SLOTS": "2", "REDIS_URL": "redis://x:1/0"}
    )
    assert worktrees(settings).ok

    git("-C", str(cache), "worktree", "add", "-q", "--detach", str(home / "elsewhere"))
    shutil.rmtree(home / "slots/S0/work")  # a slot's tree deleted behind git's back
    check = worktrees(settings)
    assert not check.ok
    problems = " ".join(check.data["problems"])
    assert "elsewhere is not a slot's" in problems and "S0/work is stale" in problems


def test_exec_orphans_flags_a_file_that_landed_and_a_process_still_alive(tmp_path: Path) -> None:
    """The orphan check passes on clean slots and fails on what a surviving orphan
    leaves: its file in a slot's tree, or its process in /proc."""
    import subprocess

    from ops.testing.chaos.checks import exec_orphans
    from ops.testing.chaos.plan import ORPHAN_MARK
    from runner.core.poll import poll_until
    from runner.core.settings import Settings

    settings = Settings.from_env({"SLOTRUNNER_HOME": str(tmp_path), "SLOTRUNNER_SLOTS": "2"})
    work = settings.slots_dir / "S1" / "work"
    work.mkdir(parents=True)
    assert exec_orphans(settings, ["job-x"], 1).ok
    landed = work / f"{ORPHAN_MARK}job-x-bg.txt"
    landed.write_text("late\n")
    found = exec_orphans(settings, ["job-x"], 1)
    assert not found.ok and found.data["landed"] == [str(landed)]
    landed.unlink()
    alive = subprocess.Popen(["bash", "-c", f"sleep 30; : {ORPHAN_MARK}job-x"])
    try:
        # Seen once bash has replaced the forked interpreter (its cmdline names the mark).
        found = poll_until(
            lambda: (c := exec_orphans(settings, ["job-x"], 1)).data["alive"] and c, 10, 0.01
        )
        assert not found.ok and found.data["alive"]
    finally:
        alive.kill()
        alive.wait()
    assert exec_orphans(settings, ["job-x"], 1).ok


def test_merged_logs_must_find_what_each_log_alone_finds() -> None:
    """All logs at once read every line and apply of each alone and find each alone's
    incidents; more is allowed (a key applied on two hosts shows only merged)."""
    from ops.testing.chaos.checks import Check
    from ops.testing.chaos.hostchecks import logs_agree

    def run(lines: int, dup: int, code: int) -> Check:
        data = {"exit_code": code, "lines": lines, "applies": lines, "counts": {"dup": dup}}
        return Check("ops_verify", not dup, "", data)

    assert logs_agree(run(20, 0, 0), [run(8, 0, 0), run(12, 0, 0)]).ok
    assert logs_agree(run(20, 1, 1), [run(8, 0, 0), run(12, 0, 0)]).ok  # more merged
    assert not logs_agree(run(20, 0, 0), [run(8, 1, 1), run(12, 0, 0)]).ok  # one lost
    assert not logs_agree(run(19, 0, 0), [run(8, 0, 0), run(12, 0, 0)]).ok  # a line lost


def test_a_frozen_attempt_that_committed_fails_on_its_own_host_only() -> None:
    """The frozen host's attempt must not commit; the same number committed by another
    host (numbers can come again after a Redis wipe) is not that attempt."""
    from ops.testing.chaos.hostchecks import frozen_never_commit
    from ops.testing.chaos.hostfaults import Frozen

    frozen = [Frozen("h1", "job-a", 1, 2, 5.0), Frozen("h2", "job-b", 1, None, 45.0)]

    def finished(job: str, attempt: int, host: str) -> dict[str, Any]:
        return {"event": "job_finished", "job_id": job, "attempt": attempt, "host": host}

    fine = [{**finished("job-a", 1, "h2"), "committed": True}]
    fine += [{**finished("job-a", 1, "h1"), "committed": False}]
    fine += [{**finished("job-b", 1, "h2"), "committed": True}]  # no takeover came: allowed
    check = frozen_never_commit(fine, frozen)
    assert check.ok and check.data["taken_over"] == 1
    late = frozen_never_commit([{**finished("job-a", 1, "h1"), "committed": True}], frozen)
    assert not late.ok and late.data["committed"] == ["job-a attempt 1 on h1"]


def test_the_receipts_check_fails_on_a_key_applied_in_two_slots(tmp_path: Path) -> None:
    """receipts_i2 runs ``ops verify --receipts`` on a host's home: a clean pool passes, a
    key applied again in another slot (a retry that landed elsewhere) fails it."""
    home = make_home(tmp_path)
    log = home / "logs" / "slotrunner.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTRUNNER_")}
    applied(ReceiptStore(home / "slots" / "S0"), "job-a:s1:w", "job-a", 1)
    clean = receipts_i2(home, log, env)
    assert clean.ok and clean.data["receipts"]["applied"] == 1, clean.to_json()
    applied(ReceiptStore(home / "slots" / "S1"), "job-a:s1:w", "job-a", 1)
    twice = receipts_i2(home, log, env)
    assert not twice.ok and twice.data["exit_code"] == 1, twice.to_json()
    assert twice.data["counts"]["duplicate_applied_receipt"] == 1
