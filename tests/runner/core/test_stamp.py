"""The stamp's lease rules (runner/core/stamp.py): which states count as held, per use."""

from __future__ import annotations

import pytest

from runner.core.stamp import SlotState, Stamp

S = SlotState

# state -> (holds_lease, lease_open, keeps_owner)
TABLE = {
    S.IDLE: (False, False, False),
    S.LEASED: (True, True, True),
    S.CANCEL_REQUESTED: (True, True, True),
    # The janitor has begun a reclaim: no call applies, but the owner may still release.
    S.OUTCOME_UNKNOWN: (False, True, False),
    # Out of the pool until an operator clears it; its job still writes its end.
    S.POISONED: (False, False, True),
}


def test_table_names_every_state() -> None:
    assert set(TABLE) == set(SlotState)


@pytest.mark.parametrize("state", list(SlotState))
def test_lease_rules(state: SlotState) -> None:
    stamp = Stamp(slot_id="S0", host="h", generation=1, job_id="j", attempt=1, state=state)
    assert (stamp.holds_lease(), stamp.lease_open(), stamp.keeps_owner()) == TABLE[state]
