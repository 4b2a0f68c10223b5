"""The two replays agree: ``ops detect``'s unrolled hot loop (``judge_batches`` over
decoded batches) finds exactly the incidents that the rules themselves
(``judge_records``, as ``ops verify`` runs them) find, line for line, on random logs
made of a few hosts, slots, generations, jobs, attempts and keys, so every rule and
every late or repeated lease line is exercised."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops.detect.detector import (
    DETECT_KINDS,
    Incident,
    KeySet,
    Replay,
    judge_batches,
    judge_records,
    read_batches,
    read_records,
)
from tests.support.detectlog import lease_line, result_line
from tests.support.fuzz import fuzz_settings

HOSTS, SLOTS, JOBS = ("h1", "h2"), ("S1", "S2"), ("A", "B", "C")
GEN, ATTEMPT, KEY = st.integers(1, 4), st.integers(1, 2), st.sampled_from(["k1", "k2", "k3", "k4"])

LEASE = st.builds(
    lease_line,
    st.sampled_from(JOBS),
    GEN,
    host=st.sampled_from(HOSTS),
    slot=st.sampled_from(SLOTS),
    released=st.booleans(),
    attempt=ATTEMPT,
)
APPLY = st.builds(
    result_line,
    st.sampled_from(JOBS),
    GEN,
    KEY,
    outcome=st.sampled_from(["applied", "applied", "replayed", "read"]),
    tool=st.sampled_from(["apply_patch", "write_file", "read_file"]),
    host=st.sampled_from(HOSTS),
    slot=st.sampled_from(SLOTS),
    attempt=ATTEMPT,
    receipt_job=st.sampled_from([None, "A", "B"]),
)


def _seen(items: list[Incident | object]) -> list[tuple[str, int, str]]:
    return [(i.kind, i.line, i.idempotency_key) for i in items if isinstance(i, Incident)]


@fuzz_settings(300)
@given(st.lists(LEASE | APPLY, max_size=60))
def test_detects_hot_loop_and_the_rules_find_the_same_incidents(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes]
) -> None:
    path: Path = tmp_path_factory.mktemp("log") / "slotrunner.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    batches, _ = read_batches([str(path)])
    fast, by_rules = Replay(KeySet()), Replay(KeySet())
    found = _seen(list(judge_batches(batches, fast)))
    records, _ = read_records([str(path)], prefilter=False)
    expected = _seen(list(judge_records(records, by_rules, DETECT_KINDS)))
    assert found == expected
    assert (fast.leases, fast.releases, fast.applies) == (
        by_rules.leases,
        by_rules.releases,
        by_rules.applies,
    )
    assert fast.slots == by_rules.slots
