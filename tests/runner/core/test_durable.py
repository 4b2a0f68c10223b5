"""The audited durable writes: whole-line appends on a kept-open descriptor, and replace."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from runner.core.durable import (
    DurabilityError,
    append_record,
    append_record_fd,
    open_append,
    replace_file,
)
from tests.support.disk import Disk


def test_open_append_creates_the_file_and_syncs_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new file's directory is fsynced before any record; an existing file's is not."""
    synced: list[int] = []
    real_fsync = os.fsync

    def spying_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spying_fsync)
    path = tmp_path / "log.jsonl"
    fd = open_append(path)
    os.close(fd)
    assert path.exists() and len(synced) == 1  # the directory, not the (empty) file
    fd = open_append(path)
    os.close(fd)
    assert len(synced) == 1


def test_append_record_fd_returns_the_end_of_its_line(tmp_path: Path) -> None:
    """Each append lands whole at the end; the offset returned is where the file ends."""
    path = tmp_path / "log.jsonl"
    fd = open_append(path)
    try:
        assert append_record_fd(fd, b'{"a":1}\n', tmp_path) == 8
        with open(path, "ab") as other:  # another appender between our two records
            other.write(b"x\n")
        assert append_record_fd(fd, b'{"b":2}\n', str(tmp_path)) == 18
    finally:
        os.close(fd)
    assert path.read_bytes() == b'{"a":1}\nx\n{"b":2}\n'


def test_a_record_must_be_one_whole_line(tmp_path: Path) -> None:
    """A record without its newline is refused before anything is written."""
    path = tmp_path / "log.jsonl"
    with pytest.raises(ValueError, match="newline"):
        append_record(path, b"no newline")
    assert not path.exists()


def test_a_failing_fsync_fails_appends_and_replaces(tmp_path: Path) -> None:
    """Given an fsync that fails, every durable write raises DurabilityError with its errno,
    and a marker file in the directory means nothing."""
    path = tmp_path / "log.jsonl"
    disk = Disk(failing=True)
    fd = open_append(path)
    try:
        with pytest.raises(DurabilityError, match="injected EIO") as failed:
            append_record_fd(fd, b"x\n", tmp_path, fsync=disk.fsync)
        assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)
    with pytest.raises(DurabilityError, match="injected EIO"):
        replace_file(tmp_path / "state.json", b"{}\n", fsync=disk.fsync)
    assert not (tmp_path / "state.json").exists()
    assert disk.calls == [str(tmp_path), str(tmp_path)]
    (tmp_path / ".fail-fsync").touch()  # the old marker: no longer a switch
    replace_file(tmp_path / "state.json", b"{}\n")
    assert (tmp_path / "state.json").read_bytes() == b"{}\n"


def test_append_record_and_replace_file_round_trip(tmp_path: Path) -> None:
    """The path-based helpers still append lines and replace whole files."""
    path = tmp_path / "log.jsonl"
    append_record(path, b"one\n")
    append_record(path, b"two\n")
    assert path.read_bytes() == b"one\ntwo\n"
    replace_file(tmp_path / "state.json", b'{"v":1}\n')
    replace_file(tmp_path / "state.json", b'{"v":2}\n')
    assert (tmp_path / "state.json").read_bytes() == b'{"v":2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "state.json"]
