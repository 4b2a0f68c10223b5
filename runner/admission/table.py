"""The admission lease's state machine, as data (docs/architecture.md §Admission).

A pure table: ``(state, op) -> Transition``. The desk's Lua script
(``runner/admission/lua.py``) receives it as JSON and only interprets it, so the
rules read here are the rules Redis applies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class LeaseState(StrEnum):
    LIVE = "live"
    EXPIRED = "expired"  # timed out locally; the request may still be running
    CANCEL_REQUESTED = "cancel_requested"  # unwanted, but not yet confirmed stopped
    RELEASED = "released"  # capacity returned; the record stays for audit
    UNKNOWN = "unknown"  # no such lease in this epoch (or not the one on record)
    FOREIGN = "foreign"  # granted by an epoch this desk no longer has


class Op(StrEnum):
    EXPIRE = "expire"
    CANCEL = "cancel"
    APPLY = "apply"
    RELEASE = "release"


class Result(StrEnum):
    CHANGED = "changed"
    NOOP = "noop"
    COMMIT = "commit"  # in the table: commit unless the step is taken
    DUPLICATE = "duplicate"  # the step was taken: this completion is dropped
    STALE = "stale"
    DOUBLE_RELEASE = "double_release"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Transition:
    to: LeaseState | None  # None: the lease record is left as it is
    result: Result
    in_flight: int = 0  # change to in_flight
    bump_generation: bool = False
    counter: str = ""  # desk counter to increment


_S, _O, _R = LeaseState, Op, Result
_NOOP = Transition(None, _R.NOOP)
_STALE = Transition(None, _R.STALE, counter="stale_completion")
_RELEASE = Transition(_S.RELEASED, _R.CHANGED, in_flight=-1, counter="released")
_UNKNOWN = Transition(None, _R.UNKNOWN)

# The lease state machine: the Lua script only interprets this table.
TRANSITIONS: Mapping[tuple[LeaseState, Op], Transition] = MappingProxyType(
    {
        (_S.LIVE, _O.EXPIRE): Transition(
            _S.EXPIRED, _R.CHANGED, bump_generation=True, counter="expired"
        ),
        (_S.LIVE, _O.CANCEL): Transition(_S.CANCEL_REQUESTED, _R.CHANGED, counter="cancelled"),
        (_S.LIVE, _O.APPLY): Transition(None, _R.COMMIT),
        (_S.LIVE, _O.RELEASE): _RELEASE,
        (_S.EXPIRED, _O.EXPIRE): _NOOP,
        (_S.EXPIRED, _O.CANCEL): _NOOP,  # already fenced; cancelling adds nothing
        (_S.EXPIRED, _O.APPLY): _STALE,
        (_S.EXPIRED, _O.RELEASE): _RELEASE,
        (_S.CANCEL_REQUESTED, _O.EXPIRE): _NOOP,
        (_S.CANCEL_REQUESTED, _O.CANCEL): _NOOP,  # repeated cancel is harmless
        (_S.CANCEL_REQUESTED, _O.APPLY): _STALE,
        (_S.CANCEL_REQUESTED, _O.RELEASE): _RELEASE,
        (_S.RELEASED, _O.EXPIRE): _NOOP,
        (_S.RELEASED, _O.CANCEL): _NOOP,
        (_S.RELEASED, _O.APPLY): _STALE,
        (_S.RELEASED, _O.RELEASE): Transition(None, _R.DOUBLE_RELEASE, counter="double_release"),
        (_S.UNKNOWN, _O.EXPIRE): _UNKNOWN,
        (_S.UNKNOWN, _O.CANCEL): _UNKNOWN,
        (_S.UNKNOWN, _O.APPLY): _STALE,
        (_S.UNKNOWN, _O.RELEASE): Transition(None, _R.UNKNOWN, counter="stale_release"),
        # A lease of a lost epoch whose request is still out: count it again.
        (_S.FOREIGN, _O.EXPIRE): Transition(
            _S.EXPIRED, _R.CHANGED, in_flight=1, bump_generation=True, counter="adopted"
        ),
        (_S.FOREIGN, _O.CANCEL): Transition(
            _S.CANCEL_REQUESTED, _R.CHANGED, in_flight=1, counter="adopted"
        ),
        (_S.FOREIGN, _O.APPLY): _STALE,
        # Never counted in this epoch, so never subtracted from it.
        (_S.FOREIGN, _O.RELEASE): Transition(None, _R.UNKNOWN, counter="stale_release"),
    }
)

HELD = (_S.LIVE, _S.EXPIRED, _S.CANCEL_REQUESTED)  # states that hold capacity


def transition(state: LeaseState, op: Op) -> Transition:
    """What ``op`` does to a lease in ``state`` (pure; the Lua script applies it)."""
    return TRANSITIONS[(LeaseState(state), Op(op))]


def table_json() -> str:
    """The table as the Lua script reads it: state -> op -> cell."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for (state, op), tr in TRANSITIONS.items():
        table.setdefault(state.value, {})[op.value] = {
            "to": tr.to.value if tr.to else "",
            "result": tr.result.value,
            "in_flight": tr.in_flight,
            "bump": tr.bump_generation,
            "counter": tr.counter,
        }
    return json.dumps(table, sort_keys=True)
