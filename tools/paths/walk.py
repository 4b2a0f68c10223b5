"""Resolving a path inside the work tree, one component at a time, from a descriptor.

Paths are resolved from a file descriptor of the work root one component at a time
(``O_NOFOLLOW`` per component, ``dir_fd`` for every call), so the directory a check
looked at is the directory the effect lands in: a symlink swapped in afterwards
cannot redirect it. Symlinks are resolved here, never by the kernel: a link in any
component (the last included) is followed only while its target stays inside the
tree; one that points out refuses the whole call, and is never replaced.

Hard links: a regular file with more than one link may share its inode with a file
outside the tree, so reading, writing, moving or removing it is refused
(:func:`require_plain`). The readers and writers over this walk are
``tools.paths.read`` and ``tools.paths.write``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import ToolError
from tools.paths.names import PathRefused, is_dotgit

MAX_SYMLINK_HOPS = 40  # Linux's MAXSYMLINKS: a loop is refused, not spun on
_O_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


@dataclass
class Walk:
    """A resolution in progress: open directories from the root down, all owned."""

    relpath: str
    work: Path
    fds: list[int]
    missing: list[str] = field(default_factory=list)  # absent directories below fds[-1]
    name: str | None = None  # last component; None when the path is a directory itself
    st: os.stat_result | None = None  # lstat of ``name`` in fds[-1]; None when absent
    blocked: str | None = None  # a non-directory met where a directory was needed
    _root_real: str | None = field(default=None, repr=False)

    @property
    def root_real(self) -> str:
        """The work root's real path, against which an absolute symlink target is
        judged: worked out when the first such link is met, not on every call (it
        costs an lstat per component of the root's path)."""
        if self._root_real is None:
            self._root_real = os.path.realpath(self.work)
        return self._root_real

    @property
    def dir_fd(self) -> int:
        return self.fds[-1]

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())

    def refuse(self, why: str) -> PathRefused:
        return PathRefused(f"path {self.relpath!r}: {why}")

    def descend(self, name: str) -> None:
        try:
            self.fds.append(os.open(name, _O_DIR, dir_fd=self.dir_fd))
        except OSError as exc:  # ELOOP/ENOTDIR: it became a symlink after our lstat
            raise self.refuse(f"{name!r} changed while being resolved") from exc

    def absent(self) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, "no such file in the work tree", self.relpath)


def resolve(walk: Walk, comps: list[str], *, follow_last: bool) -> None:
    """Walk ``comps`` from ``walk``'s directory, following symlinks only inside.

    Absent directories are not created here: they are collected in ``walk.missing``
    (a later ``..`` climbs back out of them), so a path is refused before any effect.
    The component ``/`` (only ever produced by :func:`link_target`) means the root.
    """
    pending = list(reversed(comps))
    hops = 0
    while pending:
        name = pending.pop()
        walk.name, walk.st = None, None
        if name in ("", "."):
            continue
        if name == "/":
            while len(walk.fds) > 1:
                os.close(walk.fds.pop())
            walk.missing.clear()
            continue
        if name == "..":
            if walk.missing:
                walk.missing.pop()
            elif len(walk.fds) == 1:
                raise walk.refuse("a symlink leads out of the work tree")
            else:
                os.close(walk.fds.pop())
            continue
        if is_dotgit(name):
            raise walk.refuse(f"a symlink leads into .git ({name!r})")
        last = not pending
        walk.name = name
        if walk.missing:
            if not last:
                walk.missing.append(name)
            continue
        try:
            st = os.stat(name, dir_fd=walk.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            if not last:
                walk.missing.append(name)
            continue
        if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise walk.refuse(f"more than {MAX_SYMLINK_HOPS} symlinks (a loop?)")
            pending.extend(reversed(link_target(walk, name)))
            continue
        if last:
            walk.st = st
        elif stat.S_ISDIR(st.st_mode):
            walk.descend(name)
        else:
            # Nothing exists below a file; keep walking by name so a later ``..`` is
            # still checked against the root, and let writers refuse on ``blocked``.
            walk.blocked = walk.blocked or name
            walk.missing.append(name)


def link_target(walk: Walk, name: str) -> list[str]:
    """The components of a symlink's target; an absolute one must name the tree."""
    target = os.readlink(name, dir_fd=walk.dir_fd)
    if target == "":
        raise walk.refuse(f"symlink {name!r} is empty")
    if not target.startswith("/"):
        return target.split("/")
    root = walk.root_real.split("/")
    parts = target.split("/")
    if parts[: len(root)] != root:
        raise walk.refuse(f"symlink {name!r} points out of the work tree")
    return ["/", *parts[len(root) :]]


def not_a_dir(relpath: str, name: str) -> ToolError:
    return ToolError(f"path {relpath!r}: {name!r} is not a directory")


def require_dirs(walk: Walk) -> None:
    """Before creating ``walk.missing``: every existing component must be a directory."""
    if walk.blocked is not None:
        raise not_a_dir(walk.relpath, walk.blocked)


@contextmanager
def walk_path(
    work: Path, relpath: str, comps: tuple[str, ...], *, follow_last: bool
) -> Iterator[Walk]:
    # The root itself must not be a symlink: nothing of ours makes it one.
    root_fd = os.open(work, _O_DIR)
    walk = Walk(relpath, work, [root_fd])
    try:
        resolve(walk, list(comps), follow_last=follow_last)
        yield walk
    finally:
        walk.close()


def require_link_inside(walk: Walk, name: str, at: Walk | None = None) -> None:
    """Refuse a symlink that is not followed (rm, mv) unless it resolves inside.

    ``at`` is where the link will live after a move: a relative link can point out
    from its new directory even when it points inside from its old one.
    """
    base = at or walk
    target = link_target(walk, name)
    probe = Walk(walk.relpath, walk.work, [os.dup(fd) for fd in base.fds], list(base.missing))
    probe._root_real = walk._root_real
    try:
        resolve(probe, target, follow_last=True)
    finally:
        probe.close()


def require_plain(walk: Walk, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise walk.refuse(f"is a hard link ({st.st_nlink} links); it may be a file outside")
