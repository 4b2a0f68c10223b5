"""Workspace confinement (``docs/architecture.md``, invariant I8): every tool touches
files only below ``work/``.

* :mod:`tools.paths.names` -- what a path argument may spell (:func:`check_relpath`);
* :mod:`tools.paths.walk` -- resolving it from a descriptor of the work root, one
  component at a time, symlinks followed only while they stay inside;
* :mod:`tools.paths.read` and :mod:`tools.paths.write` -- the effects, applied to the
  directory the walk resolved, never to a path the kernel resolves again.

Everything the tools call is named here.
"""

from tools.paths.names import MAX_NAME_BYTES, MAX_PATH_BYTES, PathRefused, check_relpath, is_dotgit
from tools.paths.read import digest_of, list_dir, read_bytes
from tools.paths.walk import MAX_SYMLINK_HOPS
from tools.paths.write import move, open_parent, remove, write_at, write_bytes

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_SYMLINK_HOPS",
    "PathRefused",
    "check_relpath",
    "digest_of",
    "is_dotgit",
    "list_dir",
    "move",
    "open_parent",
    "read_bytes",
    "remove",
    "write_at",
    "write_bytes",
]
