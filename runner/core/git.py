"""Running git: one pinned environment and config for every git call slotrunner makes.

The workspace layers (``runner.workspace.git.GitRunner``), the tool server's git
builtins (``tools.builtin``), the chaos campaign's expected trees, the demo's sample
repository and the benchmarks all run git through :func:`run_git`, so no call can
forget a setting that makes one tree give one id on every host, runs a hook, or waits
on a password prompt. A tree id computed anywhere (a job's end snapshot, the chaos
checker's expectation) is then the same for the same files.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from runner.errors import RunnerError

# Every git call runs with these, so a host with no global git config (or an exotic
# one: global excludes, autocrlf, hooks) builds the same trees as any other.
GIT_ENV: Final = {
    "GIT_TERMINAL_PROMPT": "0",  # a worker has no terminal: fail, never wait for a password
    "GIT_AUTHOR_NAME": "slotrunner",
    "GIT_AUTHOR_EMAIL": "slotrunner@localhost",
    "GIT_COMMITTER_NAME": "slotrunner",
    "GIT_COMMITTER_EMAIL": "slotrunner@localhost",
    # git's messages in one language, whatever the host's locale (callers quote them).
    "LANGUAGE": "C",
    "LC_ALL": "C",
}
GIT_CONFIG: Final = (
    *("-c", f"core.excludesFile={os.devnull}"),
    *("-c", "core.autocrlf=false"),
    # No hook ever runs: an agent writes into work trees, and a hook is code.
    *("-c", f"core.hooksPath={os.devnull}"),
    *("-c", "core.fsmonitor=false"),
    # Never run git inside a nested repository: one an agent planted has a config of its
    # own (filter drivers, fsmonitor) that `git status` would obey there. Its commit is
    # still compared and recorded, so tree ids do not change (architecture §Agent git).
    *("-c", "diff.ignoreSubmodules=dirty"),
    # One index file, whatever the host's config: an agent's git dir starts from a copy.
    *("-c", "core.splitIndex=false"),
    # git then refuses .git look-alikes in patches and checkouts (".g\u200cit/").
    *("-c", "core.protectHFS=true"),
    *("-c", "core.protectNTFS=true"),
    # ext:: runs a command on the worker; URLs are checked too (runner.workspace.source).
    *("-c", "protocol.ext.allow=never"),
    *("-c", "advice.detachedHead=false"),
)


class GitError(RunnerError):
    """A git command that had to succeed exited non-zero; the message quotes git."""


def git_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git child: the process's own, pinned, then ``env`` on top."""
    return {**os.environ, **GIT_ENV, **(env or {})}


def run_git(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git <pinned config> *args``; with ``check``, a failure raises :class:`GitError`.

    Output stays bytes (a tree may hold any file name); stdin is empty unless ``input``
    is given, so git never waits on the caller's terminal. A ``timeout`` raises
    ``subprocess.TimeoutExpired`` as ``subprocess.run`` does.
    """
    proc = subprocess.run(
        ["git", *GIT_CONFIG, *args],
        cwd=cwd,
        env=git_env(env),
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise GitError(
            f"git {' '.join(args)} failed (exit {proc.returncode}): {stderr_of(proc) or '-'}"
        )
    return proc


def stderr_of(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode(errors="replace").strip()


def git_text(
    *args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The stripped stdout of a git command that must succeed (``GitError`` otherwise)."""
    return run_git(*args, cwd=cwd, env=env, check=True).stdout.decode().strip()


def add_all(
    work: Path,
    *where: str,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    nested: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """``git <where> add --all`` in the tree ``work``, never running git inside a nested repo.

    ``git add`` ignores ``diff.ignoreSubmodules`` and, for a gitlink whose commit did
    not move, runs ``git status`` inside the nested repository to see if it is dirty:
    that status obeys the nested repo's own config, so a filter driver an agent put
    there would run here. Those gitlinks are updated first (``update-index``, which
    only reads the nested HEAD) and skipped by the ``add``, which records the same tree
    as a plain ``git add --all`` (docs/architecture.md §Agent git). ``nested=False``
    skips the look for them, for a caller that just deleted every nested ``.git``.
    """
    gitlinks = b""
    if nested:
        listing = run_git(*where, "ls-files", "--stage", "-z", env=env, timeout=timeout)
        gitlinks = b"".join(
            path + b"\0"
            for entry in listing.stdout.split(b"\0")
            if entry.startswith(b"160000 ")
            and (path := entry.split(b"\t", 1)[1])
            and os.path.lexists(Path(work, os.fsdecode(path), ".git"))
        )
    for flags in (("--add", "--remove"), ("--skip-worktree",)) if gitlinks else ():
        proc = run_git(*where, "update-index", "-z", *flags, "--stdin", input=gitlinks, env=env)
        if proc.returncode != 0:
            return proc
    added = run_git(*where, "add", "--all", env=env, timeout=timeout)
    if gitlinks:  # the bit would hide the path from later commands on a real index
        unskip = ("update-index", "-z", "--no-skip-worktree", "--stdin")
        run_git(*where, *unskip, input=gitlinks, env=env)
    return added
