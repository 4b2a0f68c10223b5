"""What a sandboxed command of a slot sees: one value for ``run_tests`` and ``exec``.

:func:`slot_layout` reads a slot's runner-owned paths and gives the
:class:`~tools.sandbox.policy.SlotLayout` that ``tools/sandbox/run.py`` turns into
bwrap binds: ``$SLOTRUNNER_HOME`` hidden, the tree read-write at ``/slot/work``, the
agent's own git dir read-write at ``/slot/git``, the source mirror's objects read-only
at ``/slot/source-objects`` (what its ``objects/info/alternates`` names), and the
tree's ``.git`` covered by a read-only ``gitdir: /slot/git`` (docs/architecture.md
§Agent git). ``runner/workspace/agent_git.py`` makes those paths, under the names
defined here.

Only paths the runner owns decide the binds (nothing under ``work/`` or the agent's git
dir, which sandboxed code writes): a layout that is not exactly right gives fewer
binds, never wider ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from tools.sandbox.policy import WORK_PATH, Bind, SlotLayout

WORK_DIR: Final = "work"
AGENT_GIT_DIR: Final = "agent.git"  # slots/<id>/agent.git, the agent's git dir
SOURCE_OBJECTS: Final = "source-objects"  # slots/<id>/source-objects -> the mirror's objects
AGENT_GITFILE: Final = "agent.gitfile"  # shown as work/.git inside the sandbox
GIT_PATH: Final = str(Path(WORK_PATH).parent / "git")
OBJECTS_PATH: Final = str(Path(WORK_PATH).parent / SOURCE_OBJECTS)
GITFILE_TEXT: Final = f"gitdir: {GIT_PATH}\n"
# From <git dir>/objects, the sibling of the git dir: the same on the host and inside.
ALTERNATES_TEXT: Final = f"../../{SOURCE_OBJECTS}\n"
MIRROR_SUFFIX: Final = ".mirror"


def slot_layout(slot_dir: Path, home: Path) -> SlotLayout:
    """The sandbox's view of the slot ``slot_dir`` of the host whose home is ``home``."""
    slot_dir, home = Path(slot_dir).resolve(), Path(home).resolve()
    work = slot_dir / WORK_DIR
    binds: list[Bind] = []
    agent = slot_dir / AGENT_GIT_DIR
    objects = mirror_objects(slot_dir, home)
    if objects is not None and agent.is_dir() and not agent.is_symlink():
        binds += [Bind(agent, GIT_PATH, writable=True), Bind(objects, OBJECTS_PATH)]
    dotgit = work / ".git"
    if dotgit.is_file() and not dotgit.is_symlink():
        # Covered even without an agent git dir: the runner's pointer is never writable.
        gitfile = slot_dir / AGENT_GITFILE
        ok = gitfile.is_file() and not gitfile.is_symlink()
        binds.append(Bind(gitfile if ok else Path(os.devnull), f"{WORK_PATH}/.git"))
    return SlotLayout(work=work, binds=tuple(binds), hide=(home,))


def mirror_objects(slot_dir: Path, home: Path) -> Path | None:
    """The mirror objects dir ``slots/<id>/source-objects`` links to, if it is one of ours."""
    link = slot_dir / SOURCE_OBJECTS
    if not link.is_symlink():
        return None
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    mirror = target.parent
    ours = mirror.parent == home / "repos" and mirror.name.endswith(MIRROR_SUFFIX)
    return target if ours and target.name == "objects" and target.is_dir() else None
