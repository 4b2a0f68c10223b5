"""The runner's error tree: one root, and every public error drawn in runner/errors.py."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import runner
from runner import errors
from runner.core.durable import DurabilityError
from runner.core.settings import SettingsError
from runner.errors import RunnerError
from runner.jobs.submit import SpecError


def _public_errors() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(runner.__path__, "runner."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_public_error_derives_from_the_root_and_is_drawn() -> None:
    """No exception class of the runner stands outside RunnerError or outside the drawing."""
    found = _public_errors()
    assert len(found) >= 20, sorted(found)
    outside = sorted(q for q, cls in found.items() if not issubclass(cls, RunnerError))
    assert outside == []
    # The drawing: each line of the tree is its box characters (4 a level), then a name.
    drawn: dict[str, str | None] = {}  # name -> the parent it is drawn under
    parents: list[str] = []
    for prefix, name in re.findall(r"(?m)^    ([│├└─ ]*)([A-Z]\w+)", errors.__doc__ or ""):
        depth = len(prefix) // 4
        del parents[depth:]
        drawn[name] = parents[-1] if parents else None
        parents.append(name)
    assert set(drawn) == {cls.__name__ for cls in found.values()}
    actual = {cls.__name__: cls.__bases__[0].__name__ for cls in found.values()}
    assert {n: p for n, p in drawn.items() if p} == {n: actual[n] for n in drawn if drawn[n]}


def test_errors_callers_catch_as_builtins_keep_those_bases() -> None:
    """Settings and spec errors are still ValueErrors, a failed fsync still an OSError."""
    assert issubclass(SettingsError, ValueError) and issubclass(SpecError, ValueError)
    failed = DurabilityError(5, "injected")
    assert isinstance(failed, OSError) and isinstance(failed, RunnerError)
    assert failed.errno == 5
