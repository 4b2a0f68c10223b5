"""What a tool's path argument may spell (``docs/architecture.md``, invariant I8).

:func:`check_relpath` refuses, and says why:

* empty, NUL, control characters, backslashes, absolute, any ``..`` component, more
  than 4096 bytes or a component over 255 bytes, lone surrogates;
* every name git itself treats as ``.git`` (t7415, ``is_hfs_dotgit``,
  ``is_ntfs_dotgit``): any case, trailing dots/spaces, ``:stream`` suffixes, the 8.3
  short name ``git~N``, HFS-ignorable code points inside (``.g\\u200cit``);
* look-alikes of ``.``, ``/``, ``\\`` (a character whose NFKC form holds one of
  them, e.g. U+FF0E, U+2024, or a listed symbol such as U+2215, U+2044), so no later
  normalisation can turn a name into a traversal.

Allowed: ``.`` and empty components (dropped: ``a/./b``, ``a//b``, ``dir/``), and
``...``: a plain name on POSIX that git also accepts. ``.gitignore`` and friends are
ordinary tracked files.
"""

from __future__ import annotations

import re
import unicodedata

from tools.errors import ToolError
from tools.reasons import Reason

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255

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
