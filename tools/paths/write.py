"""Writing inside the work tree: create or replace a file, remove one, move one.

A write resolves its target's directory (``tools.paths.walk``) and keeps that
directory's descriptor for the effect, so the file lands where the check looked; a
replace is a temp file and a rename in that directory, never a write through a link.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tools.errors import ToolError
from tools.paths.names import PathRefused, check_relpath
from tools.paths.walk import Walk, require_dirs, require_link_inside, require_plain, walk_path


def _make_missing(walk: Walk) -> None:
    while walk.missing:
        name = walk.missing.pop(0)
        with suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=walk.dir_fd)
        walk.descend(name)  # O_NOFOLLOW: a symlink raced in is refused, not entered


@contextmanager
def open_parent(
    work: Path, relpath: str, *, create_parents: bool = True
) -> Iterator[tuple[int, str]]:
    """Resolve a write target to (fd of its directory, name); the fd pins that directory.

    A symlink in the last component is followed when it stays inside, so the name
    yielded is the real file's; a symlink that points out refuses before any mkdir.
    """
    comps = check_relpath(relpath)
    if not comps:
        raise PathRefused("path names the work tree itself")
    with walk_path(work, relpath, comps, follow_last=True) as walk:
        if walk.name is None:
            raise ToolError(f"path {relpath!r} is a directory")
        if walk.missing and not create_parents:
            raise walk.absent()
        require_dirs(walk)
        _make_missing(walk)
        yield walk.dir_fd, walk.name


def write_at(dir_fd: int, name: str, data: bytes, relpath: str | None = None) -> None:
    """Atomically replace ``name`` in the directory ``dir_fd`` with ``data``."""
    shown = relpath or name
    mode: int | None = None
    with suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"path {shown!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"path {shown!r} is not a regular file (changed while resolved?)")
        if st.st_nlink > 1:
            raise PathRefused(f"path {shown!r} is a hard link; it may be a file outside")
        mode = stat.S_IMODE(st.st_mode)  # keep an executable script executable
    tmp = f".slotrunner-tmp-{secrets.token_hex(8)}"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o666,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        # rename(2) replaces a symlink raced in at ``name`` itself; it never writes through.
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_bytes(work: Path, relpath: str, data: bytes) -> None:
    """Create or atomically replace a file inside ``work``, making parent directories."""
    with open_parent(work, relpath) as (dir_fd, name):
        write_at(dir_fd, name, data, relpath)


def _entry_for_change(walk: Walk) -> os.stat_result:
    """The last component of a remove/move source, checked but not followed."""
    if walk.name is None:
        raise ToolError(f"path {walk.relpath!r} is a directory")
    if walk.missing or walk.st is None:
        raise walk.absent()
    if stat.S_ISLNK(walk.st.st_mode):
        require_link_inside(walk, walk.name)
    require_plain(walk, walk.st)
    return walk.st


def remove(work: Path, relpath: str) -> None:
    """Remove one file (or a symlink itself, when it points inside); never a directory."""
    comps = check_relpath(relpath)
    if not comps:
        raise PathRefused("path names the work tree itself")
    with walk_path(work, relpath, comps, follow_last=False) as walk:
        st = _entry_for_change(walk)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"path {relpath!r} is a directory; rm removes files only")
        assert walk.name is not None
        try:
            os.unlink(walk.name, dir_fd=walk.dir_fd)  # unlink never follows a symlink
        except FileNotFoundError as exc:
            raise walk.absent() from exc
        except IsADirectoryError as exc:
            raise ToolError(f"path {relpath!r} is a directory; rm removes files only") from exc


def move(work: Path, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` inside ``work`` (like rename(2): links are not followed)."""
    s, d = check_relpath(src), check_relpath(dst)
    if not s or not d:
        raise PathRefused("mv cannot move the work tree itself")
    if d[: len(s)] == s and d != s:
        raise ToolError(f"cannot move {src!r} into itself ({dst!r})")
    with (
        walk_path(work, src, s, follow_last=False) as ws,
        walk_path(work, dst, d, follow_last=False) as wd,
    ):
        st = _entry_for_change(ws)
        assert ws.name is not None and wd.name is not None
        if stat.S_ISLNK(st.st_mode):
            require_link_inside(ws, ws.name, at=wd)
        if wd.st is not None and not wd.missing:
            if stat.S_ISDIR(wd.st.st_mode):
                raise ToolError(f"destination {dst!r} is a directory")
            if stat.S_ISLNK(wd.st.st_mode):
                require_link_inside(wd, wd.name)  # never replace a link that points out
            require_plain(wd, wd.st)
        require_dirs(wd)
        _make_missing(wd)
        try:
            os.replace(ws.name, wd.name, src_dir_fd=ws.dir_fd, dst_dir_fd=wd.dir_fd)
        except FileNotFoundError as exc:
            raise ws.absent() from exc
        except OSError as exc:
            raise ToolError(f"cannot move {src!r} to {dst!r}: {exc.strerror}") from exc
