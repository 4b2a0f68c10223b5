"""The runner's error tree: one root, and every public error drawn in runner/errors.py."""

from __future__ import annotations

import runner
from runner import errors
from runner.core.durable import DurabilityError
from runner.core.settings import SettingsError
from runner.errors import RunnerError
from runner.jobs.submit import SpecError
from tests.support.errortree import assert_drawn_as_defined, public_errors


def _public_errors() -> dict[str, type[BaseException]]:
    return public_errors(runner)


def test_every_public_error_derives_from_the_root_and_is_drawn() -> None:
    """No exception class of the runner stands outside RunnerError or outside the drawing."""
    found = _public_errors()
    assert len(found) >= 20, sorted(found)
    assert_drawn_as_defined(found, RunnerError, errors.__doc__)


def test_errors_callers_catch_as_builtins_keep_those_bases() -> None:
    """Settings and spec errors are still ValueErrors, a failed fsync still an OSError."""
    assert issubclass(SettingsError, ValueError) and issubclass(SpecError, ValueError)
    failed = DurabilityError(5, "injected")
    assert isinstance(failed, OSError) and isinstance(failed, RunnerError)
    assert failed.errno == 5
