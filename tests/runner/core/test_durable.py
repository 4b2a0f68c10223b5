"""The audited durable writes: whole-line appends on a kept-open descriptor, and replace."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from runner.core import durable
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


def test_an_append_is_synced_by_its_own_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the real fsync, the line goes out in one RWF_DSYNC write and no fsync follows."""
    calls: list[str] = []
    real_pwritev = os.pwritev

    def spying_pwritev(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        calls.append("dsync" if flags & os.RWF_DSYNC else "plain")
        return real_pwritev(fd, buffers, offset, flags)

    path = tmp_path / "log.jsonl"
    fd = open_append(path)
    monkeypatch.setattr(os, "pwritev", spying_pwritev)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    try:
        assert append_record_fd(fd, b'{"a":1}\n', tmp_path) == 8
    finally:
        os.close(fd)
    assert calls == ["dsync"]
    assert path.read_bytes() == b'{"a":1}\n'


def test_a_file_system_refusing_dsync_writes_gets_write_and_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EOPNOTSUPP (refused before a byte is written) turns RWF_DSYNC off for the process:
    this line and every later one are written, then fsynced."""
    monkeypatch.setattr(durable, "_dsync_writes", True)
    refused: list[int] = []
    synced: list[int] = []
    real_fsync = os.fsync

    def refusing(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        refused.append(flags)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    def spying_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    path = tmp_path / "log.jsonl"
    fd = open_append(path)
    monkeypatch.setattr(os, "pwritev", refusing)
    monkeypatch.setattr(os, "fsync", spying_fsync)
    try:
        assert append_record_fd(fd, b"a\n", tmp_path) == 2
        assert append_record_fd(fd, b"b\n", tmp_path) == 4
    finally:
        os.close(fd)
    assert len(refused) == 1 and synced == [fd, fd]
    assert path.read_bytes() == b"a\nb\n"
    assert durable._dsync_writes is False


def test_a_failed_dsync_write_is_a_durability_error_never_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from the synced write: DurabilityError with its errno, no second try, no fsync."""
    monkeypatch.setattr(durable, "_dsync_writes", True)
    tries: list[int] = []

    def eio(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        tries.append(flags)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    path = tmp_path / "log.jsonl"
    fd = open_append(path)
    monkeypatch.setattr(os, "pwritev", eio)
    monkeypatch.setattr(os, "fsync", lambda fd: tries.append(-1))
    try:
        with pytest.raises(DurabilityError, match="durable append failed") as failed:
            append_record_fd(fd, b"a\n", tmp_path)
    finally:
        os.close(fd)
    assert failed.value.errno == errno.EIO and len(tries) == 1 and tries[0] & os.RWF_DSYNC
    assert durable._dsync_writes is True  # an EIO is not a refusal of the flag
