"""Deleting what code run in a work tree left behind, where git alone would not.

Jobs run arbitrary code (``run_tests``) in their tree: it can take away write
permission or plant a ``.git`` that makes a directory look like a nested repository.
It can also make a tree deeper than Python walks: ``os.walk`` and ``shutil.rmtree``
recurse (RecursionError past ~1000 levels, one ``write_file`` of a path of 2000
components makes that many), and a path past PATH_MAX cannot even be named. Such a tree
is handed to coreutils, which walk it by file descriptor at any depth.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Delete a tree even where code run in it took away write permission."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    os.chmod(path, 0o700)
    try:
        for root, dirs, _ in os.walk(path, onerror=_raise):
            for name in dirs:
                child = os.path.join(root, name)
                if not os.path.islink(child):  # chmod follows links: never touch outside
                    os.chmod(child, 0o700)
        shutil.rmtree(path)
    except (RecursionError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ENAMETOOLONG:
            raise
        _deep_remove(path)


def _raise(exc: OSError) -> None:
    if exc.errno == errno.ENAMETOOLONG:
        raise exc  # a tree too deep to name: _deep_remove's; other errors as before


def _deep_remove(path: Path) -> None:
    # chmod -R never follows a link it meets (and changes none): nothing outside.
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True, check=False)
    done = subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, check=False)
    if done.returncode != 0 or path.exists():
        why = done.stderr.decode(errors="replace").strip() or "rm -rf failed"
        raise OSError(errno.EIO, f"cannot remove {path}: {why}")


def remove_nested_git(work: Path) -> None:
    """Delete every ``.git`` below the work root (never the root's own ``.git`` file).

    Git never tracks such a path, but code run by ``run_tests`` can plant one, and a
    directory holding a ``.git`` looks like a nested repository to ``git clean`` and
    ``git add``: its files would survive the recycle into the next job's tree.
    """

    try:
        for dirpath, dirnames, filenames in os.walk(work, onerror=_raise):
            here = Path(dirpath)
            if here == work:
                dirnames[:] = [d for d in dirnames if d != ".git"]
                continue
            if ".git" in dirnames:
                dirnames.remove(".git")
                shutil.rmtree(here / ".git", ignore_errors=True)
            if ".git" in filenames:
                (here / ".git").unlink(missing_ok=True)
    except (RecursionError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ENAMETOOLONG:
            raise
        # Depth 1 is the root's own .git; every other one goes, file or directory.
        subprocess.run(
            ["find", str(work), "-mindepth", "2", "-name", ".git", "-prune",
             "-exec", "rm", "-rf", "--", "{}", "+"],
            capture_output=True,
            check=False,
        )  # fmt: skip
