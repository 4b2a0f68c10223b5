"""Every slotrunner verb, given bad input, exits non-zero with one line naming the problem."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from runner.cli.errors import EXIT_ERROR, EXIT_INTERNAL
from runner.cli.main import main
from runner.core import keys
from runner.core.settings import Settings

REPO = Path(__file__).resolve().parents[3]
USAGE = 2  # click's exit code for a usage error, kept as click has it

VERBS = (
    "cancel",
    "chaos",
    "demo",
    "envs",
    "fake-endpoint",
    "gateway",
    "harness",
    "ops",
    "republish",
    "result",
    "slots",
    "submit",
    "tools",
    "toolserver",
    "worker",
)
SUBVERBS = {
    "envs": ("list", "build", "rm"),
    "slots": ("list", "lease", "release"),
    "tools": ("table",),
    "ops": ("detect", "verify", "restore"),
    "harness": ("sweep",),
}


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    """The environment of a CLI run against this test's home and the session's Redis."""
    return {
        "SLOTRUNNER_HOME": str(settings.home),
        "REDIS_URL": settings.redis_url or "",
        "SLOTRUNNER_SLOTS": str(settings.slots),
        "SLOTRUNNER_HOST_ID": settings.host,
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(
        main, list(args), env=env, catch_exceptions=False, prog_name="slotrunner"
    )


def error_line(result: Result, code: int = EXIT_ERROR) -> str:
    """The one line on stderr: ``error: ...``; nothing else, no traceback."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def usage_line(result: Result) -> str:
    """click's usage error: exit 2, exactly one ``Error:`` line, no traceback."""
    assert result.exit_code == USAGE, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


# -- the command tree ---------------------------------------------------------------------


def test_root_help_lists_every_verb_and_the_exit_codes(env: dict[str, str]) -> None:
    """`slotrunner --help` names each verb, --debug and what the exit codes mean."""
    shown = run(env, "--help")
    assert shown.exit_code == 0
    listed = shown.stdout.split("Commands:")[1]
    assert {line.split()[0] for line in listed.splitlines() if line.strip()} == set(VERBS)
    assert "--debug" in shown.stdout and "70 an internal error" in shown.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_a_help_that_says_what_it_does(env: dict[str, str], verb: str) -> None:
    """`slotrunner VERB --help` (and each sub-verb's) exits 0 with a description."""
    for argv in [[verb], *([verb, sub] for sub in SUBVERBS.get(verb, ()))]:
        shown = run(env, *argv, "--help")
        assert shown.exit_code == 0, shown.stderr
        usage, _, rest = shown.stdout.partition("\n\n")
        assert usage.startswith(f"Usage: slotrunner {' '.join(argv)}")
        assert rest.split("\n\n")[0].strip(), f"{argv}: no description"


def test_the_runner_loads_no_ops_module_for_its_own_verbs() -> None:
    """runner imports no ops: its verbs run without ops; ops verbs come via entry points."""
    code = (
        "import sys\n"
        "from runner.cli.main import main\n"
        "try:\n"
        "    main(['result', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m == 'ops' or m.startswith('ops.')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# -- files that are missing or not what they claim ----------------------------------------


def test_submit_a_missing_a_non_json_and_an_invalid_spec_file(
    env: dict[str, str], tmp_path: Path
) -> None:
    """submit names the file, or the field at fault, and enqueues nothing."""
    missing = tmp_path / "missing.json"
    line = error_line(run(env, "submit", str(missing)))
    assert f"cannot read {missing}" in line and "No such file" in line
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert f"{broken} is not JSON" in error_line(run(env, "submit", str(broken)))
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"job_id": "bad\n", "repo": "/x", "planner": {}}))
    assert "nothing was enqueued" in error_line(run(env, "submit", str(invalid)))
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert "holds no job spec" in error_line(run(env, "submit", str(empty)))


def test_ops_detect_and_verify_name_a_missing_path(env: dict[str, str], tmp_path: Path) -> None:
    """ops detect/verify: a missing log is unusable input, exit 2, the path named."""
    missing = tmp_path / "gone.jsonl"
    for verb in ("detect", "verify"):
        line = error_line(run(env, "ops", verb, str(missing)))
        assert str(missing) in line and "no such file" in line


def test_a_corrupt_stamp_is_named_by_slots_list_and_release(
    env: dict[str, str], settings: Settings
) -> None:
    """A stamp.json that is not a stamp: list and release say which file, no traceback."""
    slot = settings.slots_dir / "S0"
    (slot / "work").mkdir(parents=True)
    (slot / "stamp.json").write_text('{"slot_id": "S0", "generation": ')
    for argv in (
        ("slots", "list"),
        ("slots", "list", "--json"),
        ("slots", "release", "--slot", "S0", "--job", "job-a", "--generation", "1"),
    ):
        line = error_line(run(env, *argv))
        assert f"{slot / 'stamp.json'} is not a valid stamp" in line


@pytest.mark.parametrize(
    ("stored", "problem"),
    [("garbage{", "not JSON"), ('{"job_id": 7}', "invalid JobResult")],
)
def test_a_corrupt_stored_result_is_named_by_result(
    env: dict[str, str], redis_client: redis.Redis, stored: str, problem: str
) -> None:
    """`slotrunner result JOB` over damaged bytes in Redis names the job and the damage."""
    job_id = f"corrupt-{uuid.uuid4().hex[:8]}"
    redis_client.set(keys.job_result(job_id), stored)
    try:
        line = error_line(run(env, "result", job_id))
    finally:
        redis_client.delete(keys.job_result(job_id))
    assert f"the stored result of job {job_id!r} is corrupt: {problem}" in line


# -- an unreachable Redis, a failing fsync -------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("result", "job-a"),
        ("cancel", "job-a"),
        ("republish",),
        ("slots", "lease", "--job", "job-a"),
        ("worker",),
        ("submit", "{spec}"),
    ],
)
def test_an_unreachable_redis_is_one_line(
    env: dict[str, str], closed_port: int, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """REDIS_URL at a closed port: each verb that needs Redis says so in one line."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"job_id": "job-a", "repo": "/x", "planner": {"kind": "scripted",
                                "steps": [{"tool": "git_status"}]}}))  # fmt: skip
    env = {**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port}/0"}
    line = error_line(run(env, *(a.format(spec=spec) for a in argv)))
    assert line.startswith("error: Redis:") and str(closed_port) in line


def test_a_failing_fsync_during_slots_lease_is_one_line(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """slots lease whose stamp fsync fails (EIO through the durable writer) names the failure."""

    def eio(fd: int) -> None:
        raise OSError(5, os.strerror(5))

    monkeypatch.setattr(os, "fsync", eio)  # the os module durable calls
    line = error_line(run(env, "slots", "lease", "--job", "job-a"))
    assert "fsync failed" in line and "Input/output error" in line


# -- bad arguments, verb by verb -----------------------------------------------------------


def test_ops_restore_of_an_unknown_job(env: dict[str, str]) -> None:
    """ops restore of a job with no snapshot names the job."""
    assert "no 'start' snapshot for job 'ghost'" in error_line(run(env, "ops", "restore", "ghost"))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("tools", "table", "--bogus"), "No such option '--bogus'"),
        (("ops", "detect", "--webhook", "ftp://x", "log"), "--webhook"),
        (("ops", "detect", "--follow", "-"), "stdin cannot be followed"),
        (("ops", "restore", "job", "--which", "middle"), "--which"),
        (("slots", "lease", "--job", "a\nb"), "--job"),
        (("slots", "release", "--slot", "S0"), "--job"),
        (("cancel",), "JOB_ID"),
        (("result", "a", "b"), "unexpected extra argument"),
        (("toolserver", "--port", "http"), "--port"),
        (("worker", "--pool", "gevent"), "--pool"),
        (("harness", "sweep", "--url", "http://h", "--concurrency", "x"), "not a positive integer"),
        (("harness", "sweep"), "--url"),
        (("fake-endpoint", "--slow-prob", "1.5"), "--slow-prob"),
        (("fake-endpoint", "--script", "/nonexistent/steps.json"), "cannot read --script"),
        (("chaos", "--seed", "1", "--faults", "nope"), "unknown fault kind"),
        (("chaos", "--jobs", "3"), "--seed"),
        (("demo", "--jobs", "0"), "--jobs"),
        (("demo", "--planner", "gpt"), "--planner"),
        (("demo", "--agent", "langchain"), "--agent"),
        (("demo", "--agent", "mcp", "--incident"), "--agent takes neither"),
        (("nosuchverb",), "No such command 'nosuchverb'"),
    ],
)
def test_bad_arguments_are_click_usage_errors(
    env: dict[str, str], argv: tuple[str, ...], needle: str
) -> None:
    """A bad flag or argument: click's usage error, exit 2, the flag named on one line."""
    assert needle in usage_line(run(env, *argv))


def test_named_problems_of_the_test_tools(
    env: dict[str, str], closed_port: int, tmp_path: Path
) -> None:
    """harness, fake-endpoint and toolserver: runtime problems as one `error:` line."""
    unreachable = run(env, "harness", "sweep", "--prompts", "1", "--url",
                      f"http://127.0.0.1:{closed_port}")  # fmt: skip
    assert "cannot reach" in error_line(unreachable)
    rate = run(env, "harness", "sweep", "--url", "http://127.0.0.1:1", "--rate", "5")
    assert "--open-loop" in error_line(rate)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = error_line(run(env, "fake-endpoint", "--port", port))
    assert f"cannot bind 127.0.0.1:{port}" in line
    open_bind = run({**env, "SLOTRUNNER_TOKEN": ""}, "toolserver", "--host", "0.0.0.0")
    assert "without a token" in error_line(open_bind)
    bad_id = run(env, "cancel", "../etc")
    assert "is not a job id" in error_line(bad_id)


# -- --debug and the internal-error line ----------------------------------------------------


def test_an_unexpected_exception_is_one_line_and_debug_shows_its_traceback(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug: `internal error:` on one line, exit 70; --debug adds the traceback."""
    from runner.jobs import results

    def broken(client: object, job_id: str) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(results, "load_result", broken)
    plain = run(env, "result", "job-a")
    assert error_line_internal(plain) == (
        "internal error: KeyError: 'boom' (run with --debug for the traceback)"
    )
    debug = run(env, "--debug", "result", "job-a")
    assert debug.exit_code == EXIT_INTERNAL
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert "KeyError: 'boom'" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("internal error: KeyError")


def test_debug_shows_the_traceback_of_a_named_problem_too(
    env: dict[str, str], closed_port: int
) -> None:
    """--debug before the verb: the traceback, then the same one line and exit code."""
    env = {**env, "REDIS_URL": f"redis://127.0.0.1:{closed_port}/0"}
    shown = run(env, "--debug", "result", "job-a")
    assert shown.exit_code == EXIT_ERROR
    assert "Traceback (most recent call last):" in shown.stderr
    assert shown.stderr.splitlines()[-1].startswith("error: Redis:")


def error_line_internal(result: Result) -> str:
    assert result.exit_code == EXIT_INTERNAL, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_real_process_prints_one_line_and_no_traceback(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`python -m runner.cli.main` as a real process: the same line and exit code."""
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli.main", "submit", str(tmp_path / "none.json")],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_ERROR and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot read {tmp_path / 'none.json'}: No such file or directory"
    ]
