"""Rotated receipts (tools/receipts/archive.py): a lease moves a slot's settled records
out of the hot file, and the key rules still hold for every rotated key, in this
process and in another one that had the old file open (#17)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from tools.receipts.archive import ARCHIVE_DIR, Archive
from tools.receipts.store import (
    RECEIPTS_FILE,
    Begin,
    KeyBoundToOtherJob,
    ReceiptDurabilityError,
    ReceiptStore,
    Status,
)


def begin(store: ReceiptStore, key: str, job_id: str, generation: int) -> Begin:
    return store.begin(
        key=key, job_id=job_id, attempt=1, slot_id="S0", generation=generation, tool="write_file"
    )


def applied(store: ReceiptStore, key: str, job_id: str = "job-a", generation: int = 1) -> None:
    began = begin(store, key, job_id, generation)
    assert began.fresh
    store.finish(began.receipt, Status.APPLIED, digest="d")


def hot_bytes(slot: Path) -> bytes:
    return (slot / RECEIPTS_FILE).read_bytes()


def test_a_rotated_key_is_still_applied_once_and_bound_to_its_job(slot: Path) -> None:
    store = ReceiptStore(slot)
    for i in range(3):
        applied(store, f"job-a:a1:s{i}:write_file")
    assert store.rotate() == 3
    assert hot_bytes(slot) == b""
    again = begin(store, "job-a:a1:s1:write_file", "job-a", 2)
    assert not again.fresh and again.receipt.status is Status.APPLIED
    assert again.receipt.generation == 1  # the original receipt, nothing applied again
    with pytest.raises(KeyBoundToOtherJob, match="bound to job 'job-a'"):
        begin(store, "job-a:a1:s1:write_file", "job-b", 2)
    looked = ReceiptStore(slot).lookup("job-a:a1:s2:write_file")
    assert looked is not None and looked.status is Status.APPLIED
    assert hot_bytes(slot) == b""  # a replay and a refusal write nothing


def test_an_open_intent_keeps_the_hot_file_where_it_is(slot: Path) -> None:
    store = ReceiptStore(slot)
    applied(store, "k-done")
    store.begin(key="k-open", job_id="job-a", attempt=1, slot_id="S0", generation=1, tool="exec")
    before = hot_bytes(slot)
    assert store.rotate() is None
    assert hot_bytes(slot) == before
    assert not (slot / ARCHIVE_DIR).exists()
    assert [r.key for r in store.open_intents()] == ["k-open"]


def test_records_are_every_rotation_then_the_hot_file_each_once(slot: Path) -> None:
    store = ReceiptStore(slot)
    for generation in (1, 2, 3):
        for i in range(2):
            applied(store, f"g{generation}:k{i}", generation=generation)
        if generation < 3:
            assert store.rotate() == 2
    keys = [(r.key, r.status) for r in ReceiptStore(slot).records()]
    expected = [
        (f"g{g}:k{i}", status)
        for g in (1, 2, 3)
        for i in range(2)
        for status in (Status.INTENT, Status.APPLIED)
    ]
    assert keys == expected
    segments = Archive(slot).segments()
    assert [p.name for p in segments] == ["00000001.jsonl.gz", "00000002.jsonl.gz"]
    assert gzip.decompress(segments[0].read_bytes()).count(b"\n") == 4


def test_a_hot_file_on_a_reused_inode_number_gets_a_segment_of_its_own(slot: Path) -> None:
    """A finished rotation unlinks the old hot file, and the filesystem may give its
    inode number to a later hot file (seen on ext4 within 200 rotations). That file's
    rotation must write a new segment, not overwrite the old generation's."""
    archive, hot = Archive(slot), slot / RECEIPTS_FILE
    hot.write_bytes(b"")
    first = ReceiptStore(slot)
    applied(first, "g1:k", generation=1)
    st = hot.stat()
    came_back = (st.st_dev, st.st_ino)  # the identity the next file will turn up with
    one = [r for r in first.records()]
    archive.rotate(hot, came_back, hot_bytes(slot), {"g1:k": one[-1]})
    for generation in (2, 3):  # later rotations, as on a long-lived slot
        store = ReceiptStore(slot)
        applied(store, f"g{generation}:k", generation=generation)
        assert store.rotate() == 1
    store = ReceiptStore(slot)
    applied(store, "g4:k", generation=4)
    last = [r for r in store.records() if r.key == "g4:k"][-1]
    archive.rotate(hot, came_back, hot_bytes(slot), {"g4:k": last})
    assert len(archive.segments()) == 4
    keys = [r.key for r in Archive(slot).records() if r.status is Status.APPLIED]
    assert keys == ["g1:k", "g2:k", "g3:k", "g4:k"]


def test_a_rotation_that_fails_midway_leaves_every_receipt_readable(slot: Path) -> None:
    """The disk refuses the segment's fsync: the keys are in the index already, the hot
    file is untouched, and the next rotation writes the same segment, not a second."""
    store = ReceiptStore(slot)
    applied(store, "k1")
    applied(store, "k2")
    before = hot_bytes(slot)
    calls: list[str] = []

    def fail_on_the_segment(fd: int, directory: str) -> None:
        calls.append(directory)
        if directory.endswith(ARCHIVE_DIR) and len(calls) > 1:
            raise OSError(5, "injected EIO")

    store._archive.fsync = fail_on_the_segment  # the seam the archive's writes go through
    with pytest.raises(OSError, match="injected EIO"):
        store.rotate()
    assert hot_bytes(slot) == before
    assert ReceiptStore(slot).lookup("k1") is not None
    store._archive.fsync = lambda fd, directory: None
    assert store.rotate() == 2
    assert [p.name for p in Archive(slot).segments()] == ["00000001.jsonl.gz"]
    assert [r.key for r in ReceiptStore(slot).records()] == ["k1", "k1", "k2", "k2"]


OTHER = """
import sys
from pathlib import Path
from tools.receipts.store import ReceiptStore, Status
store = ReceiptStore(Path(sys.argv[1]))
assert store.lookup("k-first") is not None  # reads the file before the rotation
print("read", flush=True)
sys.stdin.readline()  # the parent rotates meanwhile
began = store.begin(key="k-after", job_id="job-b", attempt=1, slot_id="S0", generation=2,
                    tool="write_file")
store.finish(began.receipt, Status.APPLIED)
old = store.begin(key="k-first", job_id="job-b", attempt=1, slot_id="S0", generation=2,
                  tool="write_file")
print("replayed" if not old.fresh else "APPLIED AGAIN", flush=True)
"""


def test_another_process_follows_a_rotation_of_the_file_it_had_open(slot: Path) -> None:
    """A process with the old hot file open (a tool server, a janitor) appends to the
    new one, and still finds the rotated key bound (here: a replay of job-b's key)."""
    applied(ReceiptStore(slot), "k-first", job_id="job-b")
    child = subprocess.Popen(
        [sys.executable, "-c", OTHER, str(slot)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "read"
        assert ReceiptStore(slot).rotate() == 1
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "replayed"
        assert child.wait(60) == 0
    finally:
        child.kill()
    assert b"k-after" in hot_bytes(slot) and b"k-first" not in hot_bytes(slot)


def test_a_hot_file_replaced_by_anything_but_a_rotation_is_still_a_loss(slot: Path) -> None:
    store = ReceiptStore(slot)
    applied(store, "k1")
    store.rotate()
    applied(store, "k2")
    replacement = slot / "other.jsonl"
    replacement.write_bytes(b"")
    replacement.replace(slot / RECEIPTS_FILE)
    with pytest.raises(ReceiptDurabilityError, match="replaced by another file"):
        store.lookup("k2")
