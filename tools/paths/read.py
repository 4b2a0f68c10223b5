"""Reading inside the work tree: a file's bytes, its digest, a directory's entries.

Every read opens the file it resolved (``tools.paths.walk``) with ``O_NOFOLLOW`` and
checks that the inode opened is the one resolved, so a swap in between is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools.errors import ToolError
from tools.paths.names import check_relpath, is_dotgit
from tools.paths.walk import Walk, not_a_dir, require_plain, walk_path
from tools.reasons import Reason

_READ_CHUNK_BYTES = 1 << 16


def _require_file(walk: Walk) -> os.stat_result:
    if walk.missing or (walk.name is not None and walk.st is None):
        raise walk.absent()
    if walk.name is None or walk.st is None or stat.S_ISDIR(walk.st.st_mode):
        raise ToolError(f"path {walk.relpath!r} is a directory")
    if not stat.S_ISREG(walk.st.st_mode):
        raise walk.refuse("is not a regular file")
    require_plain(walk, walk.st)
    return walk.st


@contextmanager
def _open_file(work: Path, relpath: str) -> Iterator[tuple[int, os.stat_result]]:
    comps = check_relpath(relpath)
    with walk_path(work, relpath, comps, follow_last=True) as walk:
        seen = _require_file(walk)
        assert walk.name is not None
        try:
            fd = os.open(
                walk.name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=walk.dir_fd,
            )
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise walk.absent() from exc
            raise walk.refuse("changed while being opened") from exc
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
                raise walk.refuse("changed while being opened")
            require_plain(walk, st)
            yield fd, st
        finally:
            os.close(fd)


def read_bytes(work: Path, relpath: str, max_bytes: int) -> bytes:
    """The content of a file inside ``work``; ToolError(too_large) past ``max_bytes``."""
    with _open_file(work, relpath) as (fd, st):
        too_large = ToolError(
            f"path {relpath!r} is larger than {max_bytes} bytes", Reason.TOO_LARGE
        )
        if st.st_size > max_bytes:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # the file may grow after fstat
            chunk = os.read(fd, min(_READ_CHUNK_BYTES, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise too_large
        return b"".join(chunks)


def digest_of(work: Path, relpath: str) -> str | None:
    """sha256 hex of a file's content, None when it does not exist."""
    try:
        with _open_file(work, relpath) as (fd, _st):
            h = hashlib.sha256()
            while chunk := os.read(fd, _READ_CHUNK_BYTES):
                h.update(chunk)
            return h.hexdigest()
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def list_dir(work: Path, relpath: str) -> list[dict[str, str | int]]:
    """Entries of a directory inside ``work``, sorted by name; .git names are omitted."""
    comps = check_relpath(relpath)
    with walk_path(work, relpath, comps, follow_last=True) as walk:
        if walk.missing or (walk.name is not None and walk.st is None):
            raise walk.absent()
        if walk.st is not None and not stat.S_ISDIR(walk.st.st_mode):
            raise not_a_dir(relpath, walk.name or relpath)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(walk.name or ".", flags, dir_fd=walk.dir_fd)
        except OSError as exc:
            raise walk.refuse("changed while being opened") from exc
        try:
            entries: list[dict[str, str | int]] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if is_dotgit(entry.name):  # unreachable through any tool anyway
                        continue
                    est = entry.stat(follow_symlinks=False)
                    kind = _kind(est.st_mode)
                    size = est.st_size if kind == "file" else 0
                    entries.append({"name": entry.name, "type": kind, "size": size})
        finally:
            os.close(fd)
    return sorted(entries, key=lambda e: str(e["name"]))
