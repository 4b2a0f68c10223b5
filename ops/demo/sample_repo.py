"""Make a small git repository with one commit (the demos' and the tests' sources)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from runner.core.git import git_text, run_git

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
    # The demo's own identity on top of the pinned git: its commits say who made them.
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", message]):
        run_git(*argv, cwd=path, env=_IDENTITY, check=True)
    return git_text("rev-parse", "HEAD", cwd=path)


def commit_files(path: Path, files: Mapping[str, str], message: str = "change") -> str:
    """Write ``files`` in the repository at ``path`` and commit them on top of HEAD."""
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    run_git("add", "-A", cwd=path, env=_IDENTITY, check=True)
    run_git("commit", "-q", "-m", message, cwd=path, env=_IDENTITY, check=True)
    return git_text("rev-parse", "HEAD", cwd=path)
