"""A tool's effect as the service runs it, and what its intent records beforehand.

The intent of a mutating call holds enough to tell, from the tree alone, whether its
effect happened (``tools.receipts.resolve``): the path and the digests before and
after, the patch's hash, the head before a commit. An ``exec`` intent records nothing
more: no tree can prove what a command did, so its open intent is never judged
(``tools.receipts.resolve.UNJUDGED``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools import builtin, paths, shell
from tools.envelope import Envelope


def intent_fields(tool: str, ctx: builtin.Context, args: Any) -> dict[str, Any]:
    """What the intent must record so a lost outcome can be resolved from the tree."""
    if tool == "write_file":
        paths.check_relpath(args.path)
        return {
            "relpath": args.path,
            "digest": builtin.sha256(args.content.encode("utf-8")),
            "pre_digest": paths.digest_of(ctx.work, args.path),
        }
    if tool == "apply_patch":
        builtin.check_patch(args.patch)
        return {"patch_sha256": builtin.save_patch(ctx, args.patch)}
    if tool == "rm":
        paths.check_relpath(args.path)
        return {"relpath": args.path, "pre_digest": paths.digest_of(ctx.work, args.path)}
    if tool == "mv":
        paths.check_relpath(args.src)
        paths.check_relpath(args.dst)
        return {
            "relpath": f"{args.src}\x00{args.dst}",
            "pre_digest": paths.digest_of(ctx.work, args.src),
        }
    if tool == "git_commit":
        return {"pre_digest": builtin.head_of(ctx)}
    return {}


def run_tool(tool: str, ctx: builtin.Context, args: Any, envelope: Envelope) -> dict[str, Any]:
    """Run one registered tool on the slot's tree; its result, or a ToolError."""
    if tool == "exec":
        return shell.exec_command(ctx, args, job_id=envelope.job_id, generation=envelope.generation)
    if tool == "run_tests":
        return builtin.run_tests(ctx, args, job_id=envelope.job_id, generation=envelope.generation)
    fn: Callable[[builtin.Context, Any], dict[str, Any]] = getattr(builtin, tool)
    return fn(ctx, args)
