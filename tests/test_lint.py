"""Strict tooling is part of the suite: ruff (lint and format) and mypy --strict pass."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_check_is_clean() -> None:
    """ruff finds no lint problem in the tree."""
    proc = run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean() -> None:
    """Every Python file is formatted as ruff format writes it."""
    proc = run("ruff", "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# A clean clone has no mypy cache: the whole project checked from nothing took over
# the suite's default 120 s on a slow two-core host (beside another test worker). The
# subprocess's own bound (run(): 600 s) is the limit that matters.
@pytest.mark.timeout(600)
def test_mypy_strict_is_clean() -> None:
    """mypy --strict (configured in pyproject.toml) passes on the packages, tests and bench."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert set(config["packages"]) == {"runner", "tools", "hooks", "ops", "tests", "bench"}
    proc = run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every Python file of those folders was checked: none is left out by a missing
    # __init__.py or an exclude.
    files = sum(1 for package in config["packages"] for _ in (ROOT / package).rglob("*.py"))
    assert f"no issues found in {files} source files" in proc.stdout, proc.stdout
