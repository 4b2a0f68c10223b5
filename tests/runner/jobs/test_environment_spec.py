"""A job spec's ``environment`` block: what is refused before any slot is leased
(runner/jobs/models.py EnvironmentSpec)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from runner.core.settings import Settings, SettingsError
from runner.jobs.models import JobSpec

STEPS = {"kind": "scripted", "steps": [{"tool": "run_tests"}]}


def spec(environment: Any) -> JobSpec:
    return JobSpec.model_validate({"repo": "/r", "planner": STEPS, "environment": environment})


def test_a_usual_block_is_taken_with_its_defaults() -> None:
    env = spec({"setup": [["python3", "-m", "venv", "$ENV"], ["$ENV/bin/pip", "install", "x"]]})
    assert env.environment is not None
    assert env.environment.network is True and env.environment.key_files is None
    assert env.environment.timeout_s == 900.0


@pytest.mark.parametrize(
    ("environment", "problem"),
    [
        ({"setup": []}, "at least 1 item"),
        ({"setup": [[]]}, "setup command 1 must be a non-empty argv"),
        ({"setup": [["./install.sh"]]}, "argv[0] './install.sh' must be a program on PATH"),
        ({"setup": [["bash", "a\x00b"]]}, "setup command 1 must be a non-empty argv without NUL"),
        ({"setup": [["bash"]], "key_files": ["../etc/passwd"]}, "relative to the repository"),
        ({"setup": [["bash"]], "key_files": ["/etc/passwd"]}, "relative to the repository"),
        ({"setup": [["bash"]], "key_files": []}, "at least 1 item"),
        ({"setup": [["bash"]], "network": "yes"}, "valid boolean"),
        ({"setup": [["bash"]], "timeout_s": 0}, "greater than 0"),
        ({"setup": [["bash"]], "cache": True}, "Extra inputs are not permitted"),
        (["python3", "-m", "venv"], "valid dictionary"),
    ],
)
def test_a_block_that_cannot_build_is_refused_naming_the_problem(
    environment: Any, problem: str
) -> None:
    with pytest.raises(ValidationError, match="environment") as caught:
        spec(environment)
    assert problem in str(caught.value)


def test_the_disk_bound_is_a_positive_number_of_gb() -> None:
    assert Settings.from_env({"SLOTRUNNER_ENVS_MAX_GB": "0.5"}).envs_max_gb == 0.5
    assert Settings.from_env({}).envs_max_gb == 20.0
    for raw, why in (("lots", "expected a number of GB"), ("0", "must be greater than 0")):
        with pytest.raises(SettingsError, match=f"SLOTRUNNER_ENVS_MAX_GB='{raw}': {why}"):
            Settings.from_env({"SLOTRUNNER_ENVS_MAX_GB": raw})
