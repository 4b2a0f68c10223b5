"""The agent's own git dir of a slot, ``slots/<id>/agent.git``: made anew for every job.

Sandboxed code (``run_tests``, ``exec``) runs its git on this dir, never on the
runner's worktree in the shared cache (docs/architecture.md §Agent git). ``reset``
deletes what the last job left in it (commits, stash, hooks, config, refs) and makes
a fresh one at the job's base: ``HEAD`` detached at the base, the index a copy of the
recycled worktree's (it matches the checkout, stat data included, so the first
``git status`` re-hashes nothing), a plain config, no hooks, and its objects borrowed
from the source's mirror through ``source-objects``, a symlink beside it. Beside it
too, ``agent.gitfile`` is what the sandbox shows as ``work/.git``.

No git command runs here: the files are written directly, so nothing of the host's
git config (templates, hooks) and nothing the agent wrote is ever read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from runner.workspace.fs import remove_tree
from runner.workspace.tree import WorkTree
from tools.sandbox.layout import (
    AGENT_GIT_DIR,
    AGENT_GITFILE,
    ALTERNATES_TEXT,
    GITFILE_TEXT,
    SOURCE_OBJECTS,
)

# The agent's identity until it sets its own: `git commit` must work out of the box in
# a sandbox whose $HOME is an empty tmpfs.
_CONFIG = """\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
[user]
\tname = slotrunner agent
\temail = agent@slotrunner.invalid
"""


def discard(slot_dir: Path) -> None:
    """Delete the slot's agent git dir (the recycle of a new job starts with none)."""
    remove_tree(Path(slot_dir) / AGENT_GIT_DIR)


def reset(slot_dir: Path, tree: WorkTree, mirror_objects: Path, commit: str) -> Path:
    """A fresh agent git dir for ``tree``, just recycled to ``commit``; returns its path."""
    slot_dir = Path(slot_dir)
    git_dir = slot_dir / AGENT_GIT_DIR
    remove_tree(git_dir)
    for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags"):
        (git_dir / sub).mkdir(parents=True)
    (git_dir / "HEAD").write_text(f"{commit}\n")
    (git_dir / "config").write_text(_CONFIG)
    (git_dir / "objects" / "info" / "alternates").write_text(ALTERNATES_TEXT)
    index = tree.admin / "index"
    if index.is_file():
        # copy2 keeps the mtime, so git's racy-clean check still sees through it.
        shutil.copy2(index, git_dir / "index")
    link = slot_dir / SOURCE_OBJECTS
    target = os.path.relpath(mirror_objects, slot_dir)  # a moved home keeps working
    if not link.is_symlink() or os.readlink(link) != target:
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    gitfile = slot_dir / AGENT_GITFILE
    if not gitfile.is_file() or gitfile.read_text() != GITFILE_TEXT:
        gitfile.write_text(GITFILE_TEXT)
    return git_dir
