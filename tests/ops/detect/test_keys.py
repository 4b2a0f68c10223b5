"""ops.detect.keys: the in-memory applied-key table finds every repeat as it grows."""

from __future__ import annotations

from ops.detect.keys import KeySet


def test_every_repeat_is_found_as_the_table_grows() -> None:
    """200,000 keys (the table grows several times): each new once, each repeat seen."""
    keys = KeySet()
    assert not any(keys.add(f"job-{i}:a1:s{i % 13}") for i in range(200_000))
    assert len(keys) == 200_000
    assert all(keys.add(f"job-{i}:a1:s{i % 13}") for i in range(0, 200_000, 7))
    assert not keys.add("job-200000:a1:s0")
    assert len(keys) == 200_001


def test_a_sized_table_holds_the_same_answers() -> None:
    """Sized ahead for a million keys or not, the answers are the same."""
    grown, sized = KeySet(), KeySet(expected=1_000_000)
    seq = [f"k{i % 5_000}" for i in range(20_000)]
    assert [grown.add(k) for k in seq] == [sized.add(k) for k in seq]
