"""`slotrunner envs list|build|rm`, and `slotrunner result` of a job building its environment.

Real parts throughout: a real git repository, the setup run under bubblewrap
(SLOTRUNNER_SANDBOX=required), the store's real locks (a hold taken in this process
is what a running job holds), the session's embedded Redis for `result`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from runner.cli.errors import EXIT_ERROR, EXIT_PENDING
from runner.cli.main import main
from runner.core import keys
from runner.core.settings import Settings
from runner.envs.store import EnvStore
from tests.support.repos import make_repo

# Fast and offline: the environment is a directory with a file copied from the base.
SETUP = [["bash", "-c", "mkdir -p $ENV/bin && cp README $ENV/marker"]]
FAILING = [["bash", "-c", "echo all-went-well-until; echo the-real-cause >&2; exit 3"]]


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    """The CLI's environment: this test's home, the session's Redis, bwrap required."""
    return {**settings.to_env(), "SLOTRUNNER_SANDBOX": "required", "SLOTRUNNER_TOKEN": ""}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    make_repo(path, {"README": "sample\n", "pkg/mod.py": "x = 1\n"})
    return path


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(
        main, list(args), env=env, catch_exceptions=False, prog_name="slotrunner"
    )


def error_line(result: Result, code: int = EXIT_ERROR) -> str:
    """The one line on stderr, ``error: ...``, and no traceback."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def spec_file(
    tmp_path: Path, repo: Path, setup: list[list[str]] | None = SETUP, **extra: Any
) -> str:
    spec: dict[str, Any] = {
        "repo": str(repo),
        "planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]},
        **extra,
    }
    if setup is not None:
        spec["environment"] = {"setup": setup, "network": False}
    path = tmp_path / f"spec-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def build(env: dict[str, str], path: str) -> dict[str, Any]:
    done = run(env, "envs", "build", path, "--json")
    assert done.exit_code == 0, (done.stdout, done.stderr)
    outcome: dict[str, Any] = json.loads(done.stdout)
    return outcome


def listed(env: dict[str, str]) -> list[dict[str, Any]]:
    shown = run(env, "envs", "list", "--json")
    assert shown.exit_code == 0, shown.stderr
    infos: list[dict[str, Any]] = json.loads(shown.stdout)
    return infos


def test_build_then_list_shows_it_ready_with_a_size(
    env: dict[str, str], settings: Settings, repo: Path, tmp_path: Path
) -> None:
    """A build runs the setup on the base's files and reports the key, the build and
    the log; `envs list` shows the environment ready, with its size and repo."""
    done = run(env, "envs", "build", spec_file(tmp_path, repo))
    assert done.exit_code == 0, (done.stdout, done.stderr)
    first = done.stdout.splitlines()[0]
    assert first.startswith("environment ") and " built (setup took " in first
    key = first.split()[1]
    store = EnvStore(settings.home)
    assert (store.env_dir(key) / "marker").read_text() == "sample\n"
    assert f"log  {store.log_path(key)}" in done.stdout
    assert f"building environment {key}: step 1/1" in done.stderr  # the progress, not a TTY

    table = run(env, "envs", "list")
    assert table.exit_code == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if key in line)
    assert "ready" in row and "kB" in row
    [info] = listed(env)
    assert info["key"] == key and info["state"] == "ready" and info["in_use"] is False
    assert info["size_bytes"] > 0 and info["repo"] == str(repo)
    assert info["build_s"] is not None and info["setup"] == SETUP


def test_a_second_build_of_the_same_spec_reuses_it(
    env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """The key is the spec's, not the run's: the second build finds the first's."""
    path = spec_file(tmp_path, repo)
    first = build(env, path)
    assert first["built"] is True and first["state"] == "ready"
    again = build(env, path)
    assert again["key"] == first["key"] and again["built"] is False
    assert again["build_s"] == first["build_s"] and again["log"] == first["log"]
    shown = run(env, "envs", "build", path)
    assert shown.exit_code == 0, shown.stderr
    assert f"environment {first['key']} reused" in shown.stdout
    assert "building environment" not in shown.stderr
    assert [info["key"] for info in listed(env)] == [first["key"]]


def test_a_failing_setup_exits_1_with_its_output_tail_and_lists_as_failed(
    env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """The failed step, its exit status and its output's tail on stderr, exit 1; the
    environment stays listed as failed with what failed."""
    path = spec_file(tmp_path, repo, FAILING)
    failed = run(env, "envs", "build", path)
    assert failed.exit_code == 1, (failed.stdout, failed.stderr)
    assert "Traceback" not in failed.stderr and failed.stdout == ""
    assert "environment setup failed: step 1/1" in failed.stderr
    assert "exited 3; output tail:" in failed.stderr
    assert "all-went-well-until" in failed.stderr and "the-real-cause" in failed.stderr
    assert "build log: " in failed.stderr

    [info] = listed(env)
    assert info["state"] == "failed" and "the-real-cause" in info["error"]
    table = run(env, "envs", "list")
    assert f"{info['key']} failed: step 1/1" in table.stdout and "exited 3" in table.stdout

    as_json = run(env, "envs", "build", path, "--json")
    assert as_json.exit_code == 1
    outcome = json.loads(as_json.stdout)
    assert outcome["key"] == info["key"] and outcome["state"] == "failed"
    assert "the-real-cause" in outcome["error"] and Path(outcome["log"]).is_file()


def test_rm_removes_and_an_empty_store_says_so(
    env: dict[str, str], settings: Settings, repo: Path, tmp_path: Path
) -> None:
    empty = run(env, "envs", "list")
    assert empty.exit_code == 0 and "no environments on this host" in empty.stdout
    assert listed(env) == []
    key = build(env, spec_file(tmp_path, repo))["key"]
    other = build(env, spec_file(tmp_path, repo, [["bash", "-c", "echo two > $ENV/x"]]))["key"]

    gone = run(env, "envs", "rm", key)
    assert gone.exit_code == 0, gone.stderr
    assert gone.stdout == f"removed {key}\n"
    assert not EnvStore(settings.home).root(key).exists()
    assert [info["key"] for info in listed(env)] == [other]

    every = run(env, "envs", "rm", "--all", "--json")
    assert every.exit_code == 0, every.stderr
    assert json.loads(every.stdout) == {"removed": [other], "refused": []}
    assert listed(env) == []


def test_rm_of_an_environment_in_use_is_refused_and_it_stays(
    env: dict[str, str], settings: Settings, repo: Path, tmp_path: Path
) -> None:
    """A hold (what a running job keeps for its whole attempt) makes `rm` refuse the
    environment by name, exit 2; the others named are removed all the same."""
    held_key = build(env, spec_file(tmp_path, repo))["key"]
    free_key = build(env, spec_file(tmp_path, repo, [["bash", "-c", "echo > $ENV/x"]]))["key"]
    store = EnvStore(settings.home)
    hold = store.hold(held_key)
    try:
        line = error_line(run(env, "envs", "rm", held_key))
        assert held_key in line and "used by a running job" in line
        assert store.info(held_key).state == "ready"
        state = {info["key"]: info for info in listed(env)}[held_key]
        assert state["in_use"] is True

        both = run(env, "envs", "rm", "--all", "--json")
        assert both.exit_code == EXIT_ERROR
        shown = json.loads(both.stdout)
        assert shown["removed"] == [free_key] and [r["key"] for r in shown["refused"]] == [held_key]
        assert [info["key"] for info in listed(env)] == [held_key]
    finally:
        hold.close()
    assert run(env, "envs", "rm", held_key).exit_code == 0
    assert listed(env) == []


def test_rm_names_a_key_that_is_not_one_and_removes_nothing(
    env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    key = build(env, spec_file(tmp_path, repo))["key"]
    line = error_line(run(env, "envs", "rm", key, "../etc"))
    assert "'../etc' is not an environment key" in line
    missing = "0" * 24
    assert f"no environment {missing} on this host" in error_line(run(env, "envs", "rm", missing))
    assert [info["key"] for info in listed(env)] == [key]
    for argv in (("envs", "rm"), ("envs", "rm", key, "--all")):
        usage = run(env, *argv)
        assert usage.exit_code == 2 and "(KEY...) or give --all" in usage.stderr


def test_build_of_a_spec_that_cannot_be_used_is_one_line(
    env: dict[str, str], settings: Settings, repo: Path, tmp_path: Path
) -> None:
    """A missing file, not JSON, an invalid spec, no environment block, an unknown
    base: each one line naming it, exit 2, and nothing built."""
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (str(tmp_path / "missing.json"), "cannot read"),
        (str(tmp_path / "bad.json"), "is not JSON"),
        (spec_file(tmp_path, repo, max_steps=True), "invalid job spec: max_steps"),
        (spec_file(tmp_path, repo, [[]]), "setup command 1 must be a non-empty argv"),
        (spec_file(tmp_path, repo, None), "has no environment block"),
        (spec_file(tmp_path, repo, base="no-such-branch"), "unknown base 'no-such-branch'"),
        (spec_file(tmp_path, tmp_path / "nowhere"), "does not exist"),
    ]
    for path, problem in cases:
        line = error_line(run(env, "envs", "build", path))
        assert problem in line, (path, line)
    assert EnvStore(settings.home).keys() == []


def test_result_of_a_running_job_shows_its_phase(
    env: dict[str, str], redis_client: redis.Redis
) -> None:
    """A job still building its environment: `result` says so (the worker's phase
    key), and null once the phase is gone."""
    job_id = f"envs-{uuid.uuid4().hex[:8]}"
    phase = "building environment 1a2b3c4d5e6f7a8b9c0d1e2f: step 1/2"
    redis_client.set(keys.job_state(job_id), "running")
    redis_client.set(keys.job_phase(job_id), phase)
    try:
        text = run(env, "result", job_id)
        assert text.exit_code == EXIT_PENDING
        assert text.stdout == f"{job_id}: running ({phase})\n"
        shown = run(env, "result", job_id, "--json")
        assert json.loads(shown.stdout) == {"job_id": job_id, "state": "running", "phase": phase}
        redis_client.delete(keys.job_phase(job_id))
        plain = run(env, "result", job_id, "--json")
        assert json.loads(plain.stdout) == {"job_id": job_id, "state": "running", "phase": None}
        assert run(env, "result", job_id).stdout == f"{job_id}: running\n"
    finally:
        redis_client.delete(keys.job_state(job_id), keys.job_phase(job_id))
