"""Settings.to_env (runner/core/settings.py): a child process builds the parent's settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.core.settings import Settings

FULL = {
    "SLOTRUNNER_HOME": "/srv/slotrunner",
    "REDIS_URL": "redis://127.0.0.1:7777/3",
    "SLOTRUNNER_SLOTS": "7",
    "SLOTRUNNER_TOOLSERVER_URL": "http://127.0.0.1:9999",
    "SLOTRUNNER_LEASE_TTL_S": "0.25",
    "SLOTRUNNER_TOKEN": "secret",
    "SLOTRUNNER_SANDBOX": "off",
    "SLOTRUNNER_HOST_ID": "h-1",
    "SLOTRUNNER_ENVS_MAX_GB": "2.5",
}


@pytest.mark.parametrize(
    "env",
    [FULL, {"SLOTRUNNER_HOME": "/tmp/h", "SLOTRUNNER_HOST_ID": "h-2"}],
    ids=["every-field", "defaults"],
)
def test_to_env_is_the_inverse_of_from_env(env: dict[str, str]) -> None:
    settings = Settings.from_env(env)
    assert Settings.from_env(settings.to_env()) == settings


def test_a_child_sees_the_parents_settings_not_its_inherited_environment(tmp_path: Path) -> None:
    """Unset values are passed as "", so a stray inherited variable cannot leak in."""
    settings = Settings.from_env({"SLOTRUNNER_HOME": str(tmp_path), "SLOTRUNNER_HOST_ID": "h"})
    inherited = {**os.environ, "SLOTRUNNER_TOKEN": "stray", "REDIS_URL": "redis://stray:1/0"}
    probe = (
        "import json; from runner.core.settings import Settings; "
        "s = Settings.from_env(); print(json.dumps([s.token, s.redis_url, str(s.home)]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env={**inherited, **settings.to_env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(proc.stdout) == [None, None, str(tmp_path)]
