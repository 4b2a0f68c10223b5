"""Deleting what code run in a work tree left behind, where git alone would not.

Jobs run arbitrary code (``run_tests``) in their tree: it can take away write
permission or plant a ``.git`` that makes a directory look like a nested repository.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Delete a tree even where code run in it took away write permission."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            child = os.path.join(root, name)
            if not os.path.islink(child):  # chmod follows links: never touch outside
                os.chmod(child, 0o700)
    shutil.rmtree(path)


def remove_nested_git(work: Path) -> None:
    """Delete every ``.git`` below the work root (never the root's own ``.git`` file).

    Git never tracks such a path, but code run by ``run_tests`` can plant one, and a
    directory holding a ``.git`` looks like a nested repository to ``git clean`` and
    ``git add``: its files would survive the recycle into the next job's tree.
    """

    for dirpath, dirnames, filenames in os.walk(work):
        here = Path(dirpath)
        if here == work:
            dirnames[:] = [d for d in dirnames if d != ".git"]
            continue
        if ".git" in dirnames:
            dirnames.remove(".git")
            shutil.rmtree(here / ".git", ignore_errors=True)
        if ".git" in filenames:
            (here / ".git").unlink(missing_ok=True)
