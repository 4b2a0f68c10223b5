"""What a job's tree must be when no fault touched it: its steps, applied once, to its base.

The steps run through the same ``tools.builtin`` functions the tool server runs, in
a plain clone of the base in a temporary directory, with no envelope, receipt or
network in the way. The tree id is taken the way a job's end snapshot takes it
(``runner.workspace.workspaces``): everything in the work tree, untracked files included,
through a temporary index, with the same pinned git (``runner.core.git``), so the two
ids agree whatever the host's git config says.
``run_tests`` is skipped: the campaign's test command only reads the tree; so is
``exec``: the campaign's only command (``exec_orphan``) writes nothing before it
returns, and what it leaves running must be killed before it writes anything.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ops.errors import OpsError
from runner.core.git import run_git, stderr_of
from runner.core.settings import Settings
from tools import builtin, registry


class ExpectError(OpsError):
    """A job's steps do not apply to its base even without faults (a campaign bug)."""


def _git(work: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = run_git(*args, cwd=work, env=env, timeout=builtin.GIT_TIMEOUT_S)
    if proc.returncode != 0:
        raise ExpectError(f"git {' '.join(args)}: {stderr_of(proc)}")
    return proc.stdout.decode().strip()


def expected_tree(
    repo: Path, base: str, steps: Sequence[dict[str, Any]], settings: Settings
) -> str:
    """The tree id of ``steps`` applied once to ``base`` of ``repo``."""
    with tempfile.TemporaryDirectory(prefix="slotrunner-chaos-expect-") as tmp:
        slot = Path(tmp) / "slot"
        work = slot / "work"
        slot.mkdir()
        _git(slot, "clone", "-q", "--no-checkout", str(repo), str(work))
        _git(work, "checkout", "-q", "--detach", base)
        ctx = builtin.Context(slot, settings)
        for number, step in enumerate(steps):
            tool = str(step["tool"])
            spec = registry.get(tool)
            if spec is None or not spec.mutating or tool in ("run_tests", "exec"):
                continue
            args = spec.args_model.model_validate(step.get("args") or {})
            try:
                getattr(builtin, tool)(ctx, args)
            except Exception as exc:
                raise ExpectError(f"step {number} {tool} fails without faults: {exc}") from exc
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(work, "add", "--all", env=index)
        return _git(work, "write-tree", env=index)
