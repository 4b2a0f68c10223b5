"""A ``python`` planner's entry, ``package.module:function``, resolved to its function.

The one check both doors run: ``runner.jobs.submit`` before anything is enqueued,
and the attempt (``runner.worker.attempt``) before any slot is leased, so an entry
that cannot run never holds a slot (docs/architecture.md §Agents). The module is
imported in the process that asks: the worker's environment must have the agent's
package installed or on ``PYTHONPATH``, and so must a submitting host's.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from runner.errors import RunnerError

# How much of an import error's message a job's reason keeps.
_DETAIL_CHARS = 300


class EntryError(RunnerError, ValueError):
    """An entry that cannot be imported, names nothing, or is not a callable that takes
    ``(workspace, config)``; the message says which, naming the entry."""


def load(entry: str) -> Callable[..., Any]:
    """The function ``entry`` names, ready to be called as ``fn(workspace, config)``."""
    module_name, _, attribute = entry.partition(":")
    if not module_name or not attribute:
        raise EntryError(f"planner.entry {entry!r} is not of the form 'package.module:function'")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # a user's module may raise anything while it imports
        detail = f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        raise EntryError(
            f"planner.entry {entry!r}: module {module_name!r} cannot be imported ({detail})"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise EntryError(
                f"planner.entry {entry!r}: {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(found):
        raise EntryError(
            f"planner.entry {entry!r} is not callable (it is a {type(found).__name__})"
        )
    fn: Callable[..., Any] = found
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn  # a builtin or extension without a signature: let the call tell
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise EntryError(
            f"planner.entry {entry!r} cannot be called as fn(workspace, config): {exc}"
        ) from None
    return fn
