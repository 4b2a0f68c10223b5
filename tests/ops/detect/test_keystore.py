"""ops.detect.keystore: the follower's applied keys on disk, exact through restarts and crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from hashlib import blake2b
from pathlib import Path

import pytest

from ops.detect.keystore import KEYS_FILE, LEGACY_FILE, KeyStore, KeyStoreError

REPO = Path(__file__).resolve().parents[3]


def test_repeats_are_found_within_a_poll_and_after_a_restart(tmp_path: Path) -> None:
    keys = KeyStore.open(tmp_path, 0)
    assert not any(keys.add(f"job-{i}:s{i}") for i in range(5_000))
    assert keys.add("job-7:s7")  # a repeat inside the open transaction
    count = keys.commit()
    keys.close()
    assert count == 5_000
    again = KeyStore.open(tmp_path, count)
    try:
        assert len(again) == 5_000
        assert all(again.add(f"job-{i}:s{i}") for i in range(0, 5_000, 11))
        assert not again.add("job-5000:s5000")
        assert len(again) == 5_001
    finally:
        again.close()


def test_keys_committed_past_the_checkpoint_are_cut_back(tmp_path: Path) -> None:
    """Committed, then the checkpoint was not replaced: those lines will be read again,
    and must not find their own keys."""
    keys = KeyStore.open(tmp_path, 0)
    keys.add("a")
    checkpointed = keys.commit()
    keys.add("b")
    keys.commit()  # the process died right after this, before the checkpoint
    keys.close()
    again = KeyStore.open(tmp_path, checkpointed)
    try:
        assert len(again) == 1
        assert not again.add("b")  # re-read: not its own duplicate
        assert again.add("a")
    finally:
        again.close()


def test_a_killed_follower_loses_only_its_uncommitted_keys(tmp_path: Path) -> None:
    """SIGKILL mid-poll: what was committed is there, what was not is gone."""
    child = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from ops.detect.keystore import KeyStore
        keys = KeyStore.open(Path({str(tmp_path)!r}), 0)
        for i in range(1000):
            keys.add(f"kept-{{i}}")
        print(keys.commit(), flush=True)
        for i in range(1000):
            keys.add(f"lost-{{i}}")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    count = int(proc.stdout)
    keys = KeyStore.open(tmp_path, count)
    try:
        assert len(keys) == 1000
        assert all(keys.add(f"kept-{i}") for i in range(0, 1000, 7))
        assert not any(keys.add(f"lost-{i}") for i in range(0, 1000, 7))
    finally:
        keys.close()


def test_a_table_shorter_than_the_checkpoint_is_refused(tmp_path: Path) -> None:
    keys = KeyStore.open(tmp_path, 0)
    keys.add("a")
    keys.commit()
    keys.close()
    with pytest.raises(KeyStoreError, match="holds 1 keys, the checkpoint says 5"):
        KeyStore.open(tmp_path, 5)


def test_a_damaged_table_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / KEYS_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(KeyStoreError, match=KEYS_FILE):
        KeyStore.open(tmp_path, 0)


def _legacy_journal(state: Path, keys: list[str]) -> int:
    """A version-1 ``keys.hex``: one hex blake2b-128 digest per line, as it was written."""
    data = "".join(blake2b(k.encode(), digest_size=16).hexdigest() + "\n" for k in keys).encode()
    (state / LEGACY_FILE).write_bytes(data + b"ffff")  # a tail past the checkpoint's length
    return len(data)


def test_a_version_1_journal_is_imported_once(tmp_path: Path) -> None:
    length = _legacy_journal(tmp_path, [f"old-{i}" for i in range(3000)])
    keys = KeyStore.open(tmp_path, 0, legacy_bytes=length)
    try:
        assert len(keys) == 3000
        assert keys.add("old-2999") and not keys.add("new-1")
        keys.add("new-2")
        keys.commit()  # then a crash before the first version-2 checkpoint
    finally:
        keys.close()
    os.unlink(tmp_path / LEGACY_FILE)  # not read again: the table has it
    again = KeyStore.open(tmp_path, 0, legacy_bytes=length)
    try:
        assert len(again) == 3000  # cut back to what the version-1 checkpoint knew
        assert again.add("old-0") and not again.add("new-1")
    finally:
        again.close()


def test_a_damaged_version_1_journal_leaves_no_table(tmp_path: Path) -> None:
    (tmp_path / LEGACY_FILE).write_bytes(b"not hex\n")
    with pytest.raises(KeyStoreError, match="damaged"):
        KeyStore.open(tmp_path, 0, legacy_bytes=8)
    assert not (tmp_path / KEYS_FILE).exists()  # the next start imports again
    with pytest.raises(KeyStoreError, match="shorter than the checkpoint"):
        KeyStore.open(tmp_path, 0, legacy_bytes=100)
