"""Workspace confinement (DESIGN §2 I8): every tool touches files only below ``work/``.

Paths are resolved from a file descriptor of the work root one component at a time
(``O_NOFOLLOW`` per component, ``dir_fd`` for every call), so the directory a check
looked at is the directory the effect lands in: a symlink swapped in afterwards
cannot redirect it. Symlinks are resolved by us, never by the kernel: a link in any
component (the last included) is followed only while its target stays inside the
tree; one that points out refuses the whole call, and is never replaced.

What a path may spell (:func:`check_relpath`), and why:

* refused: empty, NUL, control characters, backslashes, absolute, any ``..``
  component, more than 4096 bytes or a component over 255 bytes, lone surrogates;
* refused: every name git itself treats as ``.git`` (t7415, ``is_hfs_dotgit``,
  ``is_ntfs_dotgit``): any case, trailing dots/spaces, ``:stream`` suffixes, the
  8.3 short name ``git~N``, HFS-ignorable code points inside (``.g\\u200cit``);
* refused: look-alikes of ``.``, ``/``, ``\\`` (a character whose NFKC form holds one
  of them, e.g. U+FF0E, U+2024, or a listed symbol such as U+2215, U+2044), so no
  later normalisation can turn a name into a traversal;
* allowed: ``.`` and empty components (dropped: ``a/./b``, ``a//b``, ``dir/``), and
  ``...``: a plain name on POSIX that git also accepts. ``.gitignore`` and friends
  are ordinary tracked files.

Hard links: a regular file with more than one link may share its inode with a file
outside the tree, so reading, writing, moving or removing it is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import ToolError
from tools.reasons import Reason

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_SYMLINK_HOPS = 40  # Linux's MAXSYMLINKS: a loop is refused, not spun on
_READ_CHUNK_BYTES = 1 << 16

# Code points HFS+ ignores when comparing names (git's utf8.c next_hfs_char).
_HFS_IGNORABLE = frozenset(
    "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"
)
# After folding: ".git" or the NTFS short name, then NTFS-stripped dots/spaces, then
# an optional alternate-data-stream suffix (".git::$INDEX_ALLOCATION").
_DOTGIT = re.compile(r"(?:\.git|git~[0-9]+)[. ]*(?::.*)?", re.ASCII | re.DOTALL)
# Symbols that look like a separator or a dot but have no NFKC decomposition
# (Unicode confusables.txt, symbol blocks only: letters of living scripts stay legal).
_LOOKALIKES = frozenset(
    "\u1735\u2041\u2044\u2215\u2571\u27cb\u29f8"  # slash-like
    "\u2216\u2572\u27cd\u29f5\u29f9"  # backslash-like
    "\ua60e\U0001d16d"  # dot-like
)


class PathRefused(ToolError):
    """A path that is, or resolves to, something outside the work tree (or .git)."""

    reason = Reason.OUTSIDE_WORKSPACE

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.OUTSIDE_WORKSPACE)


def is_dotgit(name: str) -> bool:
    """True when git (on any filesystem it protects) would treat ``name`` as ``.git``."""
    visible = "".join(ch for ch in name if ch not in _HFS_IGNORABLE)
    folded = unicodedata.normalize("NFKC", visible).casefold()
    return _DOTGIT.fullmatch(folded) is not None


def _lookalike(name: str) -> str | None:
    for ch in name:
        if ch.isascii():
            continue
        if ch in _LOOKALIKES or any(s in unicodedata.normalize("NFKC", ch) for s in "./\\"):
            return ch
    return None


def check_relpath(relpath: str) -> tuple[str, ...]:
    """Validate a tool's path argument and split it; ``()`` names the work root."""
    if not isinstance(relpath, str) or relpath == "":
        raise PathRefused("path is empty")
    try:
        size = len(relpath.encode("utf-8"))
    except UnicodeEncodeError:
        raise PathRefused(f"path {relpath!r} is not valid Unicode") from None
    if "\x00" in relpath:
        raise PathRefused(f"path {relpath!r} contains a NUL byte")
    if size > MAX_PATH_BYTES:
        raise PathRefused(f"path is {size} bytes long, more than {MAX_PATH_BYTES}")
    bad = next((ch for ch in relpath if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise PathRefused(f"path {relpath!r} contains control character U+{ord(bad):04X}")
    if "\\" in relpath:
        raise PathRefused(f"path {relpath!r} contains a backslash")
    if relpath.startswith("/"):
        raise PathRefused(f"path {relpath!r} is absolute; paths are relative to the work tree")
    parts: list[str] = []
    for name in relpath.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            raise PathRefused(f"path {relpath!r} has a '..' component")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathRefused(f"path {relpath!r} has a component over {MAX_NAME_BYTES} bytes")
        ch = _lookalike(name)
        if ch is not None:
            what = f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}"
            raise PathRefused(f"path {relpath!r} contains {what}, a look-alike of '.', '/' or '\\'")
        if is_dotgit(name):
            raise PathRefused(f"path {relpath!r} reaches into .git (component {name!r})")
        parts.append(name)
    return tuple(parts)


_O_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


@dataclass
class _Walk:
    """A resolution in progress: open directories from the root down, all owned."""

    relpath: str
    root_real: str
    fds: list[int]
    missing: list[str] = field(default_factory=list)  # absent directories below fds[-1]
    name: str | None = None  # last component; None when the path is a directory itself
    st: os.stat_result | None = None  # lstat of ``name`` in fds[-1]; None when absent
    blocked: str | None = None  # a non-directory met where a directory was needed

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


def _resolve(walk: _Walk, comps: list[str], *, follow_last: bool) -> None:
    """Walk ``comps`` from ``walk``'s directory, following symlinks only inside.

    Absent directories are not created here: they are collected in ``walk.missing``
    (a later ``..`` climbs back out of them), so a path is refused before any effect.
    The component ``/`` (only ever produced by :func:`_link_target`) means the root.
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
            pending.extend(reversed(_link_target(walk, name)))
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


def _link_target(walk: _Walk, name: str) -> list[str]:
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


def _not_a_dir(relpath: str, name: str) -> ToolError:
    return ToolError(f"path {relpath!r}: {name!r} is not a directory")


def _require_dirs(walk: _Walk) -> None:
    """Before creating ``walk.missing``: every existing component must be a directory."""
    if walk.blocked is not None:
        raise _not_a_dir(walk.relpath, walk.blocked)


@contextmanager
def _walk(
    work: Path, relpath: str, comps: tuple[str, ...], *, follow_last: bool
) -> Iterator[_Walk]:
    # The root itself must not be a symlink: nothing of ours makes it one.
    root_fd = os.open(work, _O_DIR)
    walk = _Walk(relpath, os.path.realpath(work), [root_fd])
    try:
        _resolve(walk, list(comps), follow_last=follow_last)
        yield walk
    finally:
        walk.close()


def _require_link_inside(walk: _Walk, name: str, at: _Walk | None = None) -> None:
    """Refuse a symlink that is not followed (rm, mv) unless it resolves inside.

    ``at`` is where the link will live after a move: a relative link can point out
    from its new directory even when it points inside from its old one.
    """
    base = at or walk
    target = _link_target(walk, name)
    probe = _Walk(walk.relpath, walk.root_real, [os.dup(fd) for fd in base.fds], list(base.missing))
    try:
        _resolve(probe, target, follow_last=True)
    finally:
        probe.close()


def _require_plain(walk: _Walk, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise walk.refuse(f"is a hard link ({st.st_nlink} links); it may be a file outside")


def _require_file(walk: _Walk) -> os.stat_result:
    if walk.missing or (walk.name is not None and walk.st is None):
        raise walk.absent()
    if walk.name is None or walk.st is None or stat.S_ISDIR(walk.st.st_mode):
        raise ToolError(f"path {walk.relpath!r} is a directory")
    if not stat.S_ISREG(walk.st.st_mode):
        raise walk.refuse("is not a regular file")
    _require_plain(walk, walk.st)
    return walk.st


@contextmanager
def _open_file(work: Path, relpath: str) -> Iterator[tuple[int, os.stat_result]]:
    comps = check_relpath(relpath)
    with _walk(work, relpath, comps, follow_last=True) as walk:
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
            _require_plain(walk, st)
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


def _make_missing(walk: _Walk) -> None:
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
    with _walk(work, relpath, comps, follow_last=True) as walk:
        if walk.name is None:
            raise ToolError(f"path {relpath!r} is a directory")
        if walk.missing and not create_parents:
            raise walk.absent()
        _require_dirs(walk)
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


def _entry_for_change(walk: _Walk) -> os.stat_result:
    """The last component of a remove/move source, checked but not followed."""
    if walk.name is None:
        raise ToolError(f"path {walk.relpath!r} is a directory")
    if walk.missing or walk.st is None:
        raise walk.absent()
    if stat.S_ISLNK(walk.st.st_mode):
        _require_link_inside(walk, walk.name)
    _require_plain(walk, walk.st)
    return walk.st


def remove(work: Path, relpath: str) -> None:
    """Remove one file (or a symlink itself, when it points inside); never a directory."""
    comps = check_relpath(relpath)
    if not comps:
        raise PathRefused("path names the work tree itself")
    with _walk(work, relpath, comps, follow_last=False) as walk:
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
    with _walk(work, src, s, follow_last=False) as ws, _walk(work, dst, d, follow_last=False) as wd:
        st = _entry_for_change(ws)
        assert ws.name is not None and wd.name is not None
        if stat.S_ISLNK(st.st_mode):
            _require_link_inside(ws, ws.name, at=wd)
        if wd.st is not None and not wd.missing:
            if stat.S_ISDIR(wd.st.st_mode):
                raise ToolError(f"destination {dst!r} is a directory")
            if stat.S_ISLNK(wd.st.st_mode):
                _require_link_inside(wd, wd.name)  # never replace a link that points out
            _require_plain(wd, wd.st)
        _require_dirs(wd)
        _make_missing(wd)
        try:
            os.replace(ws.name, wd.name, src_dir_fd=ws.dir_fd, dst_dir_fd=wd.dir_fd)
        except FileNotFoundError as exc:
            raise ws.absent() from exc
        except OSError as exc:
            raise ToolError(f"cannot move {src!r} to {dst!r}: {exc.strerror}") from exc


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def list_dir(work: Path, relpath: str) -> list[dict[str, str | int]]:
    """Entries of a directory inside ``work``, sorted by name; .git names are omitted."""
    comps = check_relpath(relpath)
    with _walk(work, relpath, comps, follow_last=True) as walk:
        if walk.missing or (walk.name is not None and walk.st is None):
            raise walk.absent()
        if walk.st is not None and not stat.S_ISDIR(walk.st.st_mode):
            raise _not_a_dir(relpath, walk.name or relpath)
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
