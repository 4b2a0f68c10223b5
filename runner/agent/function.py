"""The ``python`` planner's loop: a user's agent function, run until it returns.

``fn(workspace, config)`` runs on a thread of its own while the attempt's thread
watches it (docs/architecture.md §Agents): every :data:`WATCH_S` it asks whether the
job must stop (superseded, cancelled, lease lost) and whether the deadline has
passed. Either closes the workspace handle (``runner.agent.api.Workspace.close``),
which waits for a call in flight, so that once this module returns nothing of the
function can touch the slot any more; the runner then takes its end snapshot and
releases the slot. A function that keeps running past that (a model call that never
answers) keeps its thread, a daemon, but every later call of its handle is refused.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.agent.api import CLOSED, DEADLINE_EXCEEDED, AgentFunction, Workspace

# How often the watching thread looks for a stop and at the deadline.
WATCH_S = 0.2
# After the handle is closed for a stop, how long the function is given to return
# (its next call raises at once; one in flight has already ended).
RETURN_GRACE_S = 2.0
_DETAIL_CHARS = 1000
# What the function returned goes into the job result (``agent.returned``) when it is
# JSON of at most this size; otherwise its repr, cut to it.
RETURNED_CHARS = 16 * 1024


@dataclass(frozen=True)
class FunctionOutcome:
    """How the function ended: ``failure`` is the job's reason when it failed (it
    raised, or outlived the deadline); ``stopped`` the stop reason the watch saw (one
    the handle saw first is the agent loop's ``stopped``)."""

    failure: str | None = None
    stopped: str | None = None
    returned: Any = None


def result_value(value: Any) -> Any:
    """``value`` as the job result can hold it: JSON of bounded size, else a cut repr."""
    try:
        if len(json.dumps(value)) <= RETURNED_CHARS:
            return value
    except (TypeError, ValueError):
        pass
    return repr(value)[:RETURNED_CHARS]


def run_function(
    fn: AgentFunction,
    workspace: Workspace,
    config: dict[str, Any],
    *,
    entry: str,
    remaining_s: Callable[[], float],
    stop_reason: Callable[[], str | None],
) -> FunctionOutcome:
    """Call ``fn(workspace, config)`` and watch it until it ends, the job is told to
    stop, or the deadline passes; the handle is closed when this returns."""
    raised: list[BaseException] = []
    returned: list[Any] = []

    def target() -> None:
        try:
            returned.append(fn(workspace, copy.deepcopy(config)))
        except BaseException as exc:  # the function's failure is the job's, never the worker's
            raised.append(exc)

    thread = threading.Thread(
        target=target, name=f"agent-{workspace.job_id}-a{workspace.attempt}", daemon=True
    )
    thread.start()
    while True:
        thread.join(WATCH_S)
        if not thread.is_alive():
            break
        stop = stop_reason()
        if stop is not None:
            workspace.close(stop)
            thread.join(RETURN_GRACE_S)
            return FunctionOutcome(stopped=stop)
        if remaining_s() <= 0:
            workspace.close(DEADLINE_EXCEEDED)
            return FunctionOutcome(
                failure=f"deadline exceeded: the agent function {entry} had not returned"
            )
    workspace.close(CLOSED)
    if not raised:
        return FunctionOutcome(returned=result_value(returned[0]) if returned else None)
    exc = raised[0]
    detail = f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
    return FunctionOutcome(failure=f"agent {entry} raised {detail}")
