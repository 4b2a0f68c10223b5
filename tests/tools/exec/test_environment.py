"""A job's built environment as exec and run_tests see it, on a real tool server under
the real bwrap: read-only at its mount, first on PATH, no network, and only for the
lease whose job description names it (docs/architecture.md §Environments)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runner.envs.build import Ready, ensure
from runner.envs.store import EnvStore
from tests.support.envs import plan_for
from tests.support.execslots import Slots, envelope, run
from tests.support.toolserver import ToolServer
from tools.builtin import write_job

HELLO = "mkdir -p $ENV/bin && printf '#!/bin/sh\\necho from-env $VIRTUAL_ENV\\n' > $ENV/bin/hello"
SETUP = [["bash", "-c", f"{HELLO} && chmod +x $ENV/bin/hello"]]


@pytest.fixture
def built(toolserver: ToolServer, slots: Slots) -> Iterator[Ready]:
    plan = plan_for(toolserver.settings, slots.repo, slots.base, SETUP)
    ready = ensure(EnvStore(toolserver.settings.home), plan, job_id="job-A")
    try:
        yield ready
    finally:
        ready.close()


def describe(slots: Slots, stamp: Any, environment: dict[str, str] | None, **job: Any) -> None:
    record = {"job_id": stamp.job_id, "generation": stamp.generation, "test_command": ["hello"]}
    if environment is not None:
        record["environment"] = environment
    write_job(slots.dir(stamp), record | job)


def test_exec_and_run_tests_see_the_environment_read_only_and_without_network(
    toolserver: ToolServer, slots: Slots, built: Ready
) -> None:
    stamp = slots.lease("job-A")
    describe(slots, stamp, {"key": built.key, "mount": built.mount})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        command = (
            "hello; touch $VIRTUAL_ENV/x; echo touch=$?; "
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\""
            "; echo connect=$?"
        )
        reply = run(toolserver.url, stamp, "job-A:e1", {"command": command})
    assert reply.status_code == 200, reply.text
    result = reply.json()["result"]
    assert result["environment"] == built.key and result["sandbox"] == "bwrap"
    output = result["output"]
    assert "from-env /slot/env" in output
    assert "Read-only file system" in output and "touch=1" in output
    assert "connect=1" in output
    assert not (EnvStore(toolserver.settings.home).env_dir(built.key) / "x").exists()
    tests = httpx.post(
        f"{toolserver.url}/v1/tools/run_tests",
        json={"envelope": envelope(stamp, "job-A:t1", "run_tests"), "args": {}},
        timeout=120,
    )
    assert tests.status_code == 200, tests.text
    ran = tests.json()["result"]
    assert ran["passed"] and ran["stdout"] == "from-env /slot/env\n"
    assert ran["environment"] == built.key


@pytest.mark.parametrize(
    "why", ["another lease's description", "a key never built", "a mount elsewhere"]
)
def test_a_description_that_is_not_exactly_right_shows_no_environment(
    toolserver: ToolServer, slots: Slots, built: Ready, why: str
) -> None:
    stamp = slots.lease("job-A")
    environment = {"key": built.key, "mount": built.mount}
    if why == "another lease's description":
        describe(slots, stamp, environment, generation=stamp.generation + 1)
    elif why == "a key never built":
        describe(slots, stamp, {"key": "0" * 24, "mount": built.mount})
    else:
        describe(slots, stamp, {"key": built.key, "mount": "/usr"})
    reply = run(toolserver.url, stamp, "job-A:e1", {"command": "hello; echo $VIRTUAL_ENV."})
    result = reply.json()["result"]
    assert "environment" not in result
    assert result["exit_code"] == 0 and "hello: command not found" in result["output"]
    assert result["output"].endswith(".\n")  # VIRTUAL_ENV unset
