"""The campaign's plan is a pure function of the seed, and every plan is runnable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ops.testing.chaos import plan as cp
from ops.testing.chaos.campaign import _make_repo
from ops.testing.chaos.expect import expected_tree
from runner.core.settings import Settings
from tools import registry


def test_same_seed_same_plan() -> None:
    """One seed always gives the same jobs and the same faults in the same places."""
    assert cp.make_plan(7, 12) == cp.make_plan(7, 12)
    assert cp.make_plan(7, 12) != cp.make_plan(8, 12)


def test_the_suite_seeds_cover_every_kind() -> None:
    """Seeds 1 and 2 with 8 jobs each plan every fault kind (the suite's campaigns)."""
    planned = {f.kind for seed in (1, 2) for f in cp.make_plan(seed, 8).faults}
    assert planned == set(cp.KINDS)


@pytest.mark.parametrize("seed", range(1, 21))
def test_faults_sit_where_they_can_act(seed: int) -> None:
    """Each fault is on a step its kind can hit; exclusive faults have their job alone."""
    plan = cp.make_plan(seed, 30)
    assert len({(f.job, f.step) for f in plan.faults}) == len(plan.faults)
    per_job: dict[int, list[str]] = {}
    for fault in plan.faults:
        per_job.setdefault(fault.job, []).append(fault.kind)
        job = plan.jobs[fault.job]
        assert fault.tool == job.tool(fault.step)
        if fault.kind in (cp.SERVER_CRASH, cp.LOSE_RESPONSE, cp.FSYNC_EIO):
            assert fault.tool in cp.EFFECT_TOOLS
        if fault.kind == cp.SLOW_REDELIVERY:
            assert fault.tool == "run_tests" and job.test_sleep_s > 0
        if fault.kind == cp.REPLAY_STALE:
            assert fault.tool in ("write_file", "apply_patch")
        if fault.step < 0:
            assert fault.kind == cp.CANCEL_STORM
        if fault.kind == cp.EXEC_ORPHAN:
            assert fault.tool == "exec" and fault.step == len(job.steps) - 1
            assert cp.ORPHAN_MARK + job.job_id in job.steps[-1]["args"]["command"]
    for kinds in per_job.values():
        assert len(kinds) <= 2
        if {cp.FSYNC_EIO, cp.CANCEL_STORM} & set(kinds):
            assert len(kinds) == 1


def test_jobs_have_six_to_ten_calls_and_each_read_once() -> None:
    """Every job makes 6-10 calls, plus at most one planted exec (its last), and a
    read-only tool appears at most once in it."""
    for seed in range(1, 21):
        for job in cp.make_plan(seed, 30).jobs:
            tools = [s["tool"] for s in job.steps]
            planted = tools.count("exec")
            assert planted <= 1 and (not planted or tools[-1] == "exec")
            assert 6 <= len(tools) - planted <= 10
            assert {"write_file", "apply_patch", "run_tests"} <= set(tools)
            for read in cp.READ_TOOLS:
                assert tools.count(read) <= 1
            for step in job.steps:
                spec = registry.get(str(step["tool"]))
                assert spec is not None
                spec.args_model.model_validate(step["args"])


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 9])
def test_planting_exec_orphans_changes_no_other_fault(seed: int) -> None:
    """exec_orphan draws from its own stream, after the rest: without it a seed plans
    exactly the faults it planned before; with it, only an exec step is added."""
    others = tuple(k for k in cp.KINDS if k != cp.EXEC_ORPHAN)
    before, after = cp.make_plan(seed, 8, others), cp.make_plan(seed, 8)
    assert [f for f in after.faults if f.kind != cp.EXEC_ORPHAN] == list(before.faults)
    for old, new in zip(before.jobs, after.jobs, strict=True):
        assert new.steps[: len(old.steps)] == old.steps
        assert [s["tool"] for s in new.steps[len(old.steps) :]] in ([], ["exec"])


def test_unknown_kind_is_named() -> None:
    """A fault kind that does not exist is refused with its name and the known ones."""
    with pytest.raises(ValueError, match=r"unknown fault kind.*nope.*kill_before_send"):
        cp.make_plan(1, 4, ("nope",))


def test_every_job_applies_cleanly_without_faults(tmp_path: Path) -> None:
    """The expected tree of each job exists: its steps apply to the base with no fault."""
    repo = tmp_path / "repo"
    base = _make_repo(repo)
    settings = Settings.from_env({"SLOTRUNNER_HOME": str(tmp_path / "home")})
    trees = set()
    for job in cp.make_plan(4, 10).jobs:
        trees.add(expected_tree(repo, base, job.steps, settings))
    assert len(trees) == 10  # each job's notes differ, so each tree does


def test_check_command_judges_the_values_file(tmp_path: Path) -> None:
    """The jobs' test command passes on integers and fails on anything else."""
    import subprocess

    job = cp.make_plan(1, 1).jobs[0]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "values.txt").write_text("1\n22\n-3\n")
    ok = subprocess.run(job.test_command(sys.executable), cwd=tmp_path, check=False)
    (tmp_path / "data" / "values.txt").write_text("1\nx\n")
    bad = subprocess.run(job.test_command(sys.executable), cwd=tmp_path, check=False)
    assert (ok.returncode, bad.returncode) == (0, 1)


# -- several hosts ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(1, 11))
def test_host_faults_are_planned_only_on_several_hosts(seed: int) -> None:
    """One host plans no host fault and refuses one by name; three hosts plan kills and
    freezes on top of exactly the faults and jobs one host plans for the seed."""
    one = cp.make_plan(seed, 30)
    assert not {f.kind for f in one.faults} & set(cp.HOST_KINDS)
    with pytest.raises(ValueError, match=r"host_kill.*two hosts"):
        cp.make_plan(seed, 30, cp.ALL_KINDS)
    three = cp.make_plan(seed, 30, cp.ALL_KINDS, hosts=3)
    assert three.jobs == one.jobs
    assert [f for f in three.faults if f.kind not in cp.HOST_KINDS] == list(one.faults)
    assert {cp.HOST_KILL, cp.HOST_FREEZE} <= {f.kind for f in three.faults}


@pytest.mark.parametrize("hosts", [2, 3, 4])
@pytest.mark.parametrize(
    "kinds", [cp.ALL_KINDS, cp.HOST_KINDS, (cp.HOST_KILL,), (cp.HOST_KILL, cp.HOST_FREEZE)]
)
def test_host_faults_always_leave_a_live_host(hosts: int, kinds: tuple[str, ...]) -> None:
    """Fewer hosts die for good than there are, one fewer again when a freeze needs a
    live host besides the frozen one; each restart follows a planned kill on its step."""
    from ops.testing.chaos.hostplan import RESTART_AFTER_S, stays_dead

    for seed in range(1, 21):
        for n_jobs in (4, 8, 30):
            plan = cp.make_plan(seed, n_jobs, kinds, hosts=hosts)
            assert [f.fault_id for f in plan.faults] == list(range(len(plan.faults)))
            host = [f for f in plan.faults if f.kind in cp.HOST_KINDS]
            freezes = [f for f in host if f.kind == cp.HOST_FREEZE]
            assert len(stays_dead(plan.faults)) + (1 if freezes else 0) <= hosts - 1
            kills = {f.fault_id: f for f in host if f.kind == cp.HOST_KILL}
            for fault in host:
                if fault.kind == cp.HOST_KILL:
                    assert fault.tool in cp.EFFECT_TOOLS
                if fault.kind == cp.HOST_RESTART:
                    kill = kills[fault.params["kill"]]
                    assert (fault.job, fault.step) == (kill.job, kill.step)
                    low, high = RESTART_AFTER_S
                    assert low <= fault.params["after_s"] <= high
            triggers = [f.job for f in host if f.kind != cp.HOST_RESTART]
            assert len(triggers) == len(set(triggers))  # one host fault a job
            if cp.HOST_RESTART not in kinds:
                assert not [f for f in host if f.kind == cp.HOST_RESTART]


def test_a_restart_without_a_kill_is_refused() -> None:
    with pytest.raises(ValueError, match=r"host_restart.*host_kill"):
        cp.make_plan(1, 8, (cp.HOST_RESTART,), hosts=2)
