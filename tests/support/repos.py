"""Real git repositories for tests, and where this checkout is."""

from __future__ import annotations

import subprocess
from pathlib import Path

# This project's own checkout: the working directory of `python -m ...` children.
REPO = Path(__file__).resolve().parents[2]


def make_repo(path: Path, files: dict[str, str] | None = None) -> str:
    """A real git repository with one commit; returns the commit id."""
    from ops.demo.sample_repo import init_repo

    return init_repo(path, files or {"pkg/lock.py": "held_by = None\n", "README": "sample\n"})


def base_tree(repo: Path, base: str) -> str:
    """The tree id of commit ``base`` in ``repo``."""
    return subprocess.run(
        ["git", "rev-parse", f"{base}^{{tree}}"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
