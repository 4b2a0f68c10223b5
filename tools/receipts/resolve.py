"""Did a mutating call whose outcome was lost actually happen? Ask the tree.

Used when an intent has no outcome (the server crashed between the effect and the
outcome record, or the reply was lost): the answer comes from the state of the
work tree, never from replaying the call.
"""

from __future__ import annotations

from tools import builtin, paths
from tools.receipts.store import Receipt

# Tools whose effect no tree can prove or disprove: an ``exec`` command may have done
# anything, or nothing, before the server died. Its open intent is never judged: it
# stays outcome unknown, and its key is never run again (docs/architecture.md
# §Exec tool).
UNJUDGED = frozenset({"exec"})


def judged(tool: str) -> bool:
    """Whether an open intent of ``tool`` may be settled from the tree (or run again)."""
    return tool not in UNJUDGED


def observe(ctx: builtin.Context, intent: Receipt) -> bool:
    """True when the tree shows the intent's effect in place (never for ``UNJUDGED``)."""
    tool = intent.tool
    if not judged(tool):
        return False
    try:
        if tool == "write_file":
            return (
                intent.relpath is not None
                and paths.digest_of(ctx.work, intent.relpath) == intent.digest
            )
        if tool == "rm":
            return intent.relpath is not None and paths.digest_of(ctx.work, intent.relpath) is None
        if tool == "mv":
            if intent.relpath is None or "\x00" not in intent.relpath:
                return False
            src, dst = intent.relpath.split("\x00", 1)
            return (
                paths.digest_of(ctx.work, src) is None
                and paths.digest_of(ctx.work, dst) == intent.pre_digest
            )
        if tool == "apply_patch":
            patch = ctx.slot_dir / builtin.PATCHES_DIR / f"{intent.patch_sha256}.patch"
            if not patch.is_file():
                return False
            proc = builtin._git(
                ctx.work,
                "apply",
                "--check",
                "--reverse",
                "--whitespace=nowarn",
                "-",
                input_bytes=patch.read_bytes(),
            )
            return proc.returncode == 0
        if tool == "git_commit":
            head = builtin.head_of(ctx)
            return head is not None and head != intent.pre_digest
    except paths.PathRefused:
        return False
    # run_tests and anything else: nothing in the tree proves it ran; running tests
    # again is harmless, so treat it as not applied.
    return False
