"""examples/environment/job.json is a spec slotrunner takes, with the environment the
e2e tests and the demo build for real (ops/demo/real_jobs.py)."""

from __future__ import annotations

import json

from ops.demo.real_jobs import ENVIRONMENT, TEST_COMMAND
from runner.jobs.submit import parse_spec
from tests.support.repos import REPO

EXAMPLE = REPO / "examples" / "environment"


def test_the_example_spec_parses_and_builds_what_the_real_stack_tests_build() -> None:
    spec = parse_spec(json.loads((EXAMPLE / "job.json").read_text()))
    assert spec.environment is not None
    assert spec.environment.setup == ENVIRONMENT["setup"]
    assert spec.environment.key_files == ["setup.py"]
    assert spec.test_command == TEST_COMMAND
    assert [step.tool for step in spec.planner.steps] == ["exec", "run_tests"]  # type: ignore[union-attr]
    assert "slotrunner submit job.json --wait" in (EXAMPLE / "README.md").read_text()
