"""Checks shared by the three error-tree tests: the classes a package defines, the drawing."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType


def public_errors(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every public exception class defined in ``package`` or below, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    prefix = f"{package.__name__}."
    for info in pkgutil.walk_packages(package.__path__, prefix):
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


def drawn_tree(doc: str | None) -> dict[str, str | None]:
    """Each name in a module docstring's drawing, with the name it is drawn under.

    A line of the drawing is four spaces, its box characters (four a level), a name.
    """
    drawn: dict[str, str | None] = {}
    parents: list[str] = []
    for prefix, name in re.findall(r"(?m)^    ([│├└─ ]*)([A-Z]\w+)", doc or ""):
        depth = len(prefix) // 4
        del parents[depth:]
        drawn[name] = parents[-1] if parents else None
        parents.append(name)
    return drawn


def assert_drawn_as_defined(
    found: dict[str, type[BaseException]], root: type[BaseException], doc: str | None
) -> None:
    """Every class derives from ``root``, is drawn, and is drawn under its first base."""
    outside = sorted(q for q, cls in found.items() if not issubclass(cls, root))
    assert outside == []
    drawn = drawn_tree(doc)
    assert set(drawn) == {cls.__name__ for cls in found.values()} | {root.__name__}
    actual = {cls.__name__: cls.__bases__[0].__name__ for cls in found.values()}
    assert {n: p for n, p in drawn.items() if p} == {n: actual[n] for n in drawn if drawn[n]}
