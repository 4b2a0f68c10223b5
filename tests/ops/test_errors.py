"""The ops package's error tree: one root, and every public error drawn in ops/errors.py."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import ops
from ops import errors
from ops.errors import OpsError


def _public_errors() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(ops.__path__, "ops."):
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


def _drawn() -> dict[str, str | None]:
    """Each name in the drawing with the name it is drawn under (box characters, 4 a level)."""
    drawn: dict[str, str | None] = {}
    parents: list[str] = []
    for prefix, name in re.findall(r"(?m)^    ([│├└─ ]*)([A-Z]\w+)", errors.__doc__ or ""):
        depth = len(prefix) // 4
        del parents[depth:]
        drawn[name] = parents[-1] if parents else None
        parents.append(name)
    return drawn


def test_every_public_error_derives_from_the_root_and_is_drawn() -> None:
    """No exception class of ops stands outside OpsError or outside the drawing."""
    found = _public_errors()
    assert len(found) >= 8, sorted(found)
    outside = sorted(q for q, cls in found.items() if not issubclass(cls, OpsError))
    assert outside == []
    drawn = _drawn()
    assert set(drawn) == {cls.__name__ for cls in found.values()} | {"OpsError"}
    actual = {cls.__name__: cls.__bases__[0].__name__ for cls in found.values()}
    assert {n: p for n, p in drawn.items() if p} == {n: actual[n] for n in drawn if drawn[n]}


def test_each_drawn_error_names_the_module_that_defines_it() -> None:
    """The module written beside a name in the drawing is where that class lives."""
    found = {cls.__name__: cls.__module__ for cls in _public_errors().values()}
    del found["OpsError"]
    doc = errors.__doc__ or ""
    for name, module in found.items():
        assert re.search(rf"{name}\s+{re.escape(module)}:", doc), name
