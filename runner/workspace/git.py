"""How workspace code runs git: one pinned environment and config, failures as WorkspaceError.

Every git call of the workspace layers (``runner.workspace.workspaces``) goes through
one ``GitRunner``, so no call can forget the settings that make one tree give one id on
every host, or the switch that keeps a worker from waiting on a password prompt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from git import Git

from runner.errors import RunnerError

# Every git call runs with these, so a host with no global git config (or an exotic
# one: global excludes, autocrlf, hooks, signing) builds the same trees as any other.
_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # a worker has no terminal: fail, never wait for a password
    "GIT_AUTHOR_NAME": "slotrunner",
    "GIT_AUTHOR_EMAIL": "slotrunner@localhost",
    "GIT_COMMITTER_NAME": "slotrunner",
    "GIT_COMMITTER_EMAIL": "slotrunner@localhost",
}
_CONFIG = (
    *("-c", f"core.excludesFile={os.devnull}"),
    *("-c", "core.autocrlf=false"),
    *("-c", f"core.hooksPath={os.devnull}"),
    *("-c", "core.fsmonitor=false"),
    *("-c", "protocol.ext.allow=never"),
    *("-c", "advice.detachedHead=false"),
)


class WorkspaceError(RunnerError):
    """A work tree or snapshot operation failed; the message says what and why."""


class GitRunner:
    """Runs one git command line; called as ``git(*args, env=..., check=..., what=...)``."""

    def __init__(self) -> None:
        self._git_cmd = Git()

    def __call__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> tuple[int, bytes, str]:
        status, out, err = self._git_cmd.execute(
            [Git.GIT_PYTHON_GIT_EXECUTABLE or "git", *_CONFIG, *args],
            with_extended_output=True,
            with_exceptions=False,
            stdout_as_string=False,
            strip_newline_in_stdout=False,
            env={**_ENV, **(env or {})},
        )
        if check and status != 0:
            raise WorkspaceError(
                f"git {what or _verb(args)} failed (exit {status}): {err.strip() or '-'}"
            )
        return status, out, err


def _verb(args: tuple[str, ...]) -> str:
    """The git subcommand of `args`, past the global options and their paths."""
    rest = list(args)
    while rest and rest[0] in ("--git-dir", "--work-tree", "-C"):
        rest = rest[2:]
    return rest[0] if rest else "?"
