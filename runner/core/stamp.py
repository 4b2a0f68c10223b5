"""A slot's ``stamp.json``: who holds the slot, at which generation, until when.

The stamp lives in ``slots/<id>/`` beside ``work/``, never inside it, so nothing an
agent writes into its tree can forge it. It is only ever written through
``runner.core.durable.replace_file``.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runner.core.durable import Fsync, os_fsync, replace_file
from runner.errors import RunnerError

STAMP_FILE = "stamp.json"
SLOT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SlotState(StrEnum):
    IDLE = "idle"
    LEASED = "leased"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCEL_REQUESTED = "cancel_requested"
    POISONED = "poisoned"


# Which states count as "the lease is held" -- one rule per question asked of a stamp,
# each named once here (docs/architecture.md, "Stamp"):
#   HOLDS_LEASE  the lease is live: its tool calls apply, it may be renewed or cancelled,
#                and an operator's restore must not overwrite its tree.
#   LEASE_OPEN   the lease has not ended: its owner may still release it and the janitor
#                may reclaim it (outcome_unknown is a reclaim the janitor has begun).
#   KEEPS_OWNER  the slot is still its attempt's for the runner's own writes: a poisoned
#                slot takes no tool call and no new lease, but its job still writes its
#                end snapshot and job.json into it.
HOLDS_LEASE = frozenset({SlotState.LEASED, SlotState.CANCEL_REQUESTED})
LEASE_OPEN = HOLDS_LEASE | {SlotState.OUTCOME_UNKNOWN}
KEEPS_OWNER = HOLDS_LEASE | {SlotState.POISONED}


class StampError(RunnerError):
    """A stamp file exists but cannot be read as a stamp."""


class Stamp(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    slot_id: str
    host: str
    generation: int
    job_id: str | None = None
    attempt: int | None = None
    state: SlotState = SlotState.IDLE
    leased_at: str | None = None
    lease_expires_at: str | None = None
    reason: str | None = None

    def expires_at(self) -> datetime | None:
        if self.lease_expires_at is None:
            return None
        return datetime.fromisoformat(self.lease_expires_at)

    def is_expired(self, now: datetime) -> bool:
        expires = self.expires_at()
        return expires is not None and now >= expires

    def holds_lease(self) -> bool:
        """The lease is live (see ``HOLDS_LEASE``); expiry is a separate question."""
        return self.state in HOLDS_LEASE

    def lease_open(self) -> bool:
        """The lease has not ended: releasable by its owner, reclaimable by the janitor."""
        return self.state in LEASE_OPEN

    def keeps_owner(self) -> bool:
        """The slot is still its attempt's for the runner's own (fenced) writes."""
        return self.state in KEEPS_OWNER


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def valid_slot_id(slot_id: str) -> bool:
    return bool(SLOT_ID_RE.match(slot_id))


def read_stamp(slot_dir: Path) -> Stamp | None:
    """The slot's stamp, or None when the slot has none yet."""
    try:
        raw = (slot_dir / STAMP_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Stamp.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise StampError(f"{slot_dir / STAMP_FILE} is not a valid stamp: {exc}") from None


def write_stamp(slot_dir: Path, stamp: Stamp, *, fsync: Fsync = os_fsync) -> None:
    data = stamp.model_dump_json(indent=1).encode() + b"\n"
    replace_file(slot_dir / STAMP_FILE, data, fsync=fsync)
