"""ops.detect.keys: the applied-key table finds every repeat, through growth and a restart."""

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


def test_journal_digests_rebuild_the_same_set() -> None:
    """With a journal, the digests handed out restore a set that knows exactly those keys."""
    first = KeySet(journal=True)
    for i in range(10_000):
        first.add(f"key-{i}")
    first.add("key-3")  # a repeat adds no digest
    digests = first.take_fresh()
    assert len(digests) == 10_000 and first.take_fresh() == []
    again = KeySet(digests, journal=True)
    assert len(again) == 10_000
    assert again.add("key-9999") and not again.add("key-10000")
    assert len(again.take_fresh()) == 1  # only the new key's digest, to be persisted
