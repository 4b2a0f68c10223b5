"""How workspace code runs git: ``runner.core.git``'s pinned runner, failing as WorkspaceError.

Every git call of the workspace layers (``runner.workspace.workspaces``) goes through
one ``GitRunner``, so no call can forget the settings that make one tree give one id on
every host, or the switch that keeps a worker from waiting on a password prompt.
"""

from __future__ import annotations

from collections.abc import Mapping

from runner.core.git import run_git, stderr_of
from runner.errors import RunnerError


class WorkspaceError(RunnerError):
    """A work tree or snapshot operation failed; the message says what and why."""


class GitRunner:
    """Runs one git command line; called as ``git(*args, env=..., check=..., what=...)``."""

    def __call__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> tuple[int, bytes, str]:
        proc = run_git(*args, env=env)
        status, err = proc.returncode, stderr_of(proc)
        if check and status != 0:
            raise WorkspaceError(f"git {what or _verb(args)} failed (exit {status}): {err or '-'}")
        return status, proc.stdout, err


def _verb(args: tuple[str, ...]) -> str:
    """The git subcommand of `args`, past the global options and their paths."""
    rest = list(args)
    while rest and rest[0] in ("--git-dir", "--work-tree", "-C"):
        rest = rest[2:]
    return rest[0] if rest else "?"
