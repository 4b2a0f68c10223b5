"""Whether a decoded value is plain JSON that every hop of a job can carry.

A job spec crosses Redis, Celery's JSON messages, the host's log and the tool server's
HTTP bodies. Python's ``json`` reads more than JSON: ``NaN``, ``Infinity`` and
``1e999`` (an infinite float), and ``"\\ud800"`` (a lone surrogate, which no UTF-8
encoder takes), and Python callers can pass anything. Any of these would be accepted
at submit time and break a later hop (a request body that cannot be encoded, a log
line that is not JSON), and a value nested past the encoder's recursion limit cannot
be sent at all. So the spec is checked once, at the door (``runner.jobs.models.JobSpec``,
docs/architecture.md §Job spec), and the problem is named by its place in the spec.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

# Far deeper than any spec needs (a tool's arguments are flat, a python planner's
# config a few levels), far shallower than the JSON encoder's recursion limit.
MAX_DEPTH = 64


def problem(value: Any) -> str | None:
    """Why ``value`` is not plain JSON, naming where (``planner.steps.0.args.x: ...``),
    or None. Walks without recursion, so a value of any depth is judged."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        here = where or "the spec"
        if depth > MAX_DEPTH:
            return f"{here}: nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, str):
            if not _text(item):
                return f"{here}: not valid Unicode text (a lone surrogate)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{here}: {item!r} is not a JSON number"
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                if not isinstance(key, str) or not _text(key):
                    return f"{here}: a key that is not valid text ({key!r})"
                stack.append((inner, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(item, list | tuple):
            for index in reversed(range(len(item))):
                stack.append((item[index], f"{where}.{index}" if where else str(index), depth + 1))
        # (A model a Python caller built is validated by its own class.)
        elif item is not None and not isinstance(item, bool | int | BaseModel):
            return f"{here}: a {type(item).__name__} is not a JSON value"
    return None


def _text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
