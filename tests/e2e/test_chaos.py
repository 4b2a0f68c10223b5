"""Seeded fault campaigns on the real stack: every check passes, and a broken fence fails.

Each campaign runs real Celery workers, a real tool server behind the fault proxy and
its own embedded Redis (``ops.testing.chaos.campaign``).
Seeds 1 and 2 together plan every fault kind
(``test_chaos_plan``); whatever the interleaving, the checks must all hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.testing.chaos.campaign import ChaosConfig, run_campaign
from ops.testing.chaos.report import REPORT_JSON, REPORT_TXT

OWNERSHIP = ("stale_generation_apply", "cross_job_apply")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2])
def test_campaign_holds_every_invariant(seed: int, tmp_path: Path) -> None:
    """Under every fault kind, all checks pass and no key is applied twice."""
    report = run_campaign(ChaosConfig(seed=seed, jobs=8, report_dir=tmp_path / "chaos"))
    assert report.ok, [c.to_json() for c in report.checks if not c.ok]
    assert report.duplicate_applies == 0 and report.duplicates_per_100_faults == 0
    assert len(report.injected) >= 8, report.fired
    assert sum(report.states.values()) == 8
    saved = json.loads((tmp_path / "chaos" / REPORT_JSON).read_text())
    assert saved["seed"] == seed and saved["ok"] is True
    assert "duplicates_per_100_faults" in saved and (tmp_path / "chaos" / REPORT_TXT).is_file()


@pytest.mark.timeout(300)
def test_campaign_fails_when_the_fence_is_off(tmp_path: Path) -> None:
    """With the envelope hook switched off, replayed old envelopes land: the detector and
    the verifier both report the stale apply, and the campaign fails."""
    report = run_campaign(
        ChaosConfig(
            seed=3,
            jobs=6,
            report_dir=tmp_path / "chaos",
            kinds=("replay_stale",),
            fence=False,
        )
    )
    assert not report.ok
    for name in ("ops_verify", "ops_detect"):
        check = report.check(name)
        assert not check.ok and check.data["exit_code"] == 1, check
        assert sum(check.data["counts"][kind] for kind in OWNERSHIP) >= 1, check.data
    assert not report.check("replays_refused").ok


@pytest.mark.timeout(240)
def test_redis_restarted_empty_mid_job_loses_nothing_and_reissues_no_attempt(
    tmp_path: Path,
) -> None:
    """Redis is SIGKILLed and comes back without its AOF while a job's call is in flight:
    every job still ends once, no attempt number starts twice, generations only grow."""
    report = run_campaign(
        ChaosConfig(seed=4, jobs=6, report_dir=tmp_path / "chaos", kinds=("redis_wipe",))
    )
    assert report.ok, [c.to_json() for c in report.checks if not c.ok]
    wipes = [f for f in report.fired if f["kind"] == "redis_wipe" and not f["skipped"]]
    assert len(wipes) == 1 and "Redis restarted empty (" in wipes[0]["detail"], wipes
    lost = int(wipes[0]["detail"].split("(")[1].split()[0])
    assert lost > 0, wipes  # the jobs' keys, the queue: there was something to lose
    # the job whose call met the wipe was running; it had to start again, above its
    # old number
    started = report.check("attempts_never_repeat")
    assert started.ok and sum(report.states.values()) == 6, started.detail


@pytest.mark.timeout(240)
def test_campaign_fails_when_a_wipe_can_reissue_attempt_numbers(tmp_path: Path) -> None:
    """Without the host's attempt floor, the attempt counter restarts at 1 after the wipe:
    the job that was running starts attempt 1 a second time, and the check says so."""
    report = run_campaign(
        ChaosConfig(
            seed=4,
            jobs=6,
            report_dir=tmp_path / "chaos",
            kinds=("redis_wipe",),
            attempt_floor=False,
        )
    )
    check = report.check("attempts_never_repeat")
    assert not check.ok and not report.ok, check.detail
    wiped_job = next(f["job_id"] for f in report.fired if f["kind"] == "redis_wipe")
    assert 1 in check.data["repeated"].get(wiped_job, []), check.data


def chaos_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLOTRUNNER_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "chaos", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.timeout(300)
def test_cli_prints_the_report_and_exits_by_its_verdict(tmp_path: Path) -> None:
    """`slotrunner chaos --json` prints the report and exits 0 when every check passed."""
    done = chaos_cli(tmp_path, "--seed", "9", "--jobs", "2", "--faults", "http_429", "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["faults_by_kind"] == {"http_429": 1}
    assert (tmp_path / "home" / "chaos" / "9" / REPORT_JSON).is_file()


@pytest.mark.timeout(300)
def test_two_hosts_one_killed_whole_and_restarted_one_frozen_whole(tmp_path: Path) -> None:
    """`chaos --hosts 2`: a host SIGKILLed whole mid-call comes back on its home and
    settles the leases its dead left open before leasing again; a host SIGSTOPped
    whole has its job taken over by the other host; the killed attempt's job starts a
    newer attempt; every check passes over both hosts' logs, slots and processes."""
    kinds = "host_kill,host_freeze,host_restart"
    done = chaos_cli(
        tmp_path, "--seed", "1", "--jobs", "6", "--hosts", "2", "--faults", kinds, "--json"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and sum(report["states"].values()) == 6
    assert report["faults_by_kind"] == {"host_kill": 1, "host_freeze": 1, "host_restart": 1}
    assert [h["host"] for h in report["hosts"]] == ["h1", "h2"]
    assert all(h["state"] == "up" and h["attempts_started"] for h in report["hosts"])
    checks = {c["name"]: c for c in report["checks"]}
    assert {"ops_verify@h1", "ops_verify@h2", "ops_detect@h1", "ops_detect@h2"} <= set(checks)
    assert checks["restarts_settle_first"]["data"]["settled"] >= 1, checks
    assert checks["frozen_attempts_never_commit"]["data"]["taken_over"] == 1, checks
    kill = next(f for f in report["fired"] if f["kind"] == "host_kill")
    hosts = tmp_path / "home" / "chaos" / "1" / "home" / "hosts"
    started = [
        json.loads(line)
        for log in hosts.glob("h*/logs/slotrunner.jsonl")
        for line in log.read_text().splitlines()
        if '"job_started"' in line
    ]
    moved = [e for e in started if e["job_id"] == kill["job_id"] and e["attempt"] > kill["attempt"]]
    assert moved, (kill, started)


def test_cli_names_an_unknown_fault_kind(tmp_path: Path) -> None:
    """A fault kind that does not exist is a usage error naming it, and nothing runs."""
    done = chaos_cli(tmp_path, "--seed", "1", "--faults", "kill_before_send,nope")
    assert done.returncode == 2
    assert "nope" in done.stderr and "kill_before_send" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "chaos").exists()
    one_host = chaos_cli(tmp_path, "--seed", "1", "--faults", "host_kill")
    assert one_host.returncode == 2 and "--hosts 2" in one_host.stderr, one_host.stderr
    assert not (tmp_path / "home" / "chaos").exists()


@pytest.mark.timeout(120)
def test_sigterm_stops_the_campaign_and_everything_it_started(tmp_path: Path) -> None:
    """A campaign killed politely (SIGTERM) leaves no worker, tool server or Redis behind."""
    import contextlib
    import signal

    from ops.testing.chaos.checks import scan_processes
    from ops.testing.chaos.stack import LogTail
    from runner.core import events
    from tests.support.stack import wait_until

    env = {**os.environ, "SLOTRUNNER_HOME": str(tmp_path / "home")}
    report_dir = tmp_path / "home" / "chaos" / "5"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli.main", "chaos", "--seed", "5", "--jobs", "4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = LogTail(report_dir / "home" / "logs" / "slotrunner.jsonl")

    def taking_jobs() -> bool:
        assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
        return bool(log.find(events.JOB_STARTED))

    # The host's log says a worker took a job: the whole stack is up and busy.
    wait_until("a worker of the campaign to start a job", taking_jobs, timeout_s=60)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    # Killed children can take a moment to be reaped; the assert below shows who is left.
    with contextlib.suppress(AssertionError):
        wait_until(
            "the campaign's processes to exit", lambda: not scan_processes(report_dir / "home"), 30
        )
    assert scan_processes(report_dir / "home") == []
