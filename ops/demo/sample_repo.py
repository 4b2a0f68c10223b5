"""Make a small git repository with one commit (the demos' and the tests' sources)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

_IDENTITY = {
    "GIT_AUTHOR_NAME": "slotrunner-demo",
    "GIT_AUTHOR_EMAIL": "demo@localhost",
    "GIT_COMMITTER_NAME": "slotrunner-demo",
    "GIT_COMMITTER_EMAIL": "demo@localhost",
}


def init_repo(path: Path, files: Mapping[str, str], message: str = "base") -> str:
    """Write ``files`` under ``path``, commit them on ``main``; returns the commit id."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    # A fixed identity: the machine may have no git config at all.
    env = {**os.environ, **_IDENTITY}
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", message],
    ):
        subprocess.run(argv, cwd=path, env=env, check=True, capture_output=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, env=env, check=True, capture_output=True, text=True
    )
    return head.stdout.strip()
