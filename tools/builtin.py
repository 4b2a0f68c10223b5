"""The built-in tools: what each one does to a slot's work tree.

Every function takes the slot directory and validated arguments and returns a small
JSON-able result, or raises :class:`ToolFailed` (a definite failure: nothing was
changed) or :class:`tools.paths.PathRefused`. Paths go through ``tools.paths``
only; repository code runs only through ``tools.sandbox.run``.

Each mutating tool also knows how to tell, from the tree alone, whether a call whose
outcome was lost did happen (:func:`observe`): that is how an intent without an
outcome is resolved after a crash, instead of replaying it blindly (I4).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core.durable import replace_file
from runner.core.git import add_all, run_git
from runner.core.settings import Settings
from tools import paths
from tools.errors import ToolError
from tools.reasons import Reason
from tools.sandbox import run as sandbox
from tools.sandbox.environment import Environment, environment_of
from tools.sandbox.layout import slot_layout

READ_MAX_BYTES = 4 * 1024 * 1024
GIT_TIMEOUT_S = 120.0
JOB_FILE = "job.json"
PATCHES_DIR = "patches"


class ToolFailed(ToolError):
    """The tool ran and failed definitely; the tree is unchanged."""

    reason = Reason.MALFORMED


@dataclass(frozen=True)
class Context:
    slot_dir: Path
    settings: Settings

    @property
    def work(self) -> Path:
        return self.slot_dir / "work"

    @property
    def layout(self) -> sandbox.SlotLayout:
        """What a sandboxed command of this slot sees (docs/architecture.md §Agent git)."""
        return slot_layout(self.slot_dir, self.settings.home)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git(
    work: Path, *args: str, input_bytes: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    # The pinned runner: no hooks, no host config that changes a tree, no .git look-alikes.
    return run_git(*args, cwd=work, input=input_bytes, timeout=GIT_TIMEOUT_S)


# -- read-only ------------------------------------------------------------------


def read_file(ctx: Context, args: Any) -> dict[str, Any]:
    data = paths.read_bytes(ctx.work, args.path, READ_MAX_BYTES)
    try:
        return {"path": args.path, "content": data.decode("utf-8"), "size": len(data)}
    except UnicodeDecodeError:
        return {
            "path": args.path,
            "content": data.decode("utf-8", "replace"),
            "size": len(data),
            "binary": True,
        }


def list_dir(ctx: Context, args: Any) -> dict[str, Any]:
    return {"path": args.path, "entries": paths.list_dir(ctx.work, args.path)}


def git_status(ctx: Context, args: Any) -> dict[str, Any]:
    proc = _git(ctx.work, "status", "--porcelain=v1", "--untracked-files=all")
    if proc.returncode != 0:
        raise ToolFailed(f"git status failed: {proc.stderr.decode(errors='replace').strip()}")
    return {"status": proc.stdout.decode(errors="replace")}


# -- mutating -------------------------------------------------------------------


def write_file(ctx: Context, args: Any) -> dict[str, Any]:
    data = args.content.encode("utf-8")
    paths.write_bytes(ctx.work, args.path, data)
    return {"path": args.path, "bytes": len(data), "digest": sha256(data)}


_PATCH_PATH = re.compile(rb"^(?:\+\+\+|---) (?:[ab]/)?(.+?)\t?$|^diff --git a/(.+?) b/(.+)$")


def patch_paths(patch: str) -> list[str]:
    """Every path a unified diff names (old and new), for confinement checks."""
    found: list[str] = []
    for line in patch.encode("utf-8").splitlines():
        match = _PATCH_PATH.match(line)
        if not match:
            continue
        for group in match.groups():
            if group and group != b"/dev/null":
                name = group.decode("utf-8", "replace")
                if name not in found:
                    found.append(name)
    return found


def check_patch(patch: str) -> list[str]:
    """Refuse a patch naming any path outside the tree, before git sees it."""
    names = patch_paths(patch)
    if re.search(r"^(?:new file mode|new mode|old mode) 120000", patch, re.MULTILINE):
        # A patch-made symlink could point anywhere; the tree's paths must stay plain.
        raise ToolFailed("the patch creates or changes a symlink (mode 120000): refused")
    if not names:
        raise ToolFailed("the patch names no file: expected a unified diff as `git diff` writes it")
    for name in names:
        paths.check_relpath(name)
    return names


def save_patch(ctx: Context, patch: str) -> str:
    """Keep the patch beside the receipts so a lost outcome can be resolved later."""
    data = patch.encode("utf-8")
    digest = sha256(data)
    directory = ctx.slot_dir / PATCHES_DIR
    directory.mkdir(exist_ok=True)
    target = directory / f"{digest}.patch"
    if not target.exists():
        replace_file(target, data)
    return digest


def apply_patch(ctx: Context, args: Any) -> dict[str, Any]:
    names = check_patch(args.patch)
    data = args.patch.encode("utf-8")
    check = _git(ctx.work, "apply", "--check", "--whitespace=nowarn", "-", input_bytes=data)
    if check.returncode != 0:
        raise ToolFailed(
            f"the patch does not apply: {check.stderr.decode(errors='replace').strip()}"
        )
    proc = _git(ctx.work, "apply", "--whitespace=nowarn", "-", input_bytes=data)
    if proc.returncode != 0:
        raise ToolFailed(f"git apply failed: {proc.stderr.decode(errors='replace').strip()}")
    return {"files": names, "patch_sha256": sha256(data)}


def rm(ctx: Context, args: Any) -> dict[str, Any]:
    paths.remove(ctx.work, args.path)
    return {"path": args.path, "removed": True}


def mv(ctx: Context, args: Any) -> dict[str, Any]:
    paths.move(ctx.work, args.src, args.dst)
    return {"src": args.src, "dst": args.dst}


def git_commit(ctx: Context, args: Any) -> dict[str, Any]:
    # add_all: a plain `git add -A` would run git (and its config) inside a nested repo.
    add = add_all(ctx.work, "-C", str(ctx.work), timeout=GIT_TIMEOUT_S)
    if add.returncode != 0:
        raise ToolFailed(f"git add failed: {add.stderr.decode(errors='replace').strip()}")
    proc = _git(ctx.work, "commit", "--no-verify", "--allow-empty", "-q", "-m", args.message)
    if proc.returncode != 0:
        raise ToolFailed(f"git commit failed: {proc.stderr.decode(errors='replace').strip()}")
    head = _git(ctx.work, "rev-parse", "HEAD").stdout.decode().strip()
    return {"commit": head}


def head_of(ctx: Context) -> str | None:
    proc = _git(ctx.work, "rev-parse", "HEAD")
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def read_job(slot_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((slot_dir / JOB_FILE).read_text())
    except (OSError, ValueError):
        raise ToolFailed(
            "this slot has no job description: run_tests has no test command"
        ) from None
    if not isinstance(data, dict):
        raise ToolFailed("the slot's job description is not an object")
    return data


def write_job(slot_dir: Path, job: dict[str, Any]) -> None:
    """The runner records the job's test command here (outside work/, like the stamp)."""
    replace_file(slot_dir / JOB_FILE, json.dumps(job).encode())


def interpreter_roots(program: str, home: Path) -> list[Path]:
    """Read-only roots the test command's own interpreter needs inside the sandbox.

    A test command such as ``/opt/venv/bin/python -m pytest`` names an interpreter that
    may live under a directory the sandbox hides (``/tmp``, ``/root``): its
    environment root and the real interpreter's prefix are shown read-only, nothing
    else. Nothing under ``$SLOTRUNNER_HOME`` is ever shown.
    """
    if not os.path.isabs(program):
        return []
    roots = []
    for exe in (Path(program), Path(os.path.realpath(program))):
        root = exe.parent.parent if exe.parent.name == "bin" else exe.parent
        if root != Path("/") and not root.resolve().is_relative_to(home.resolve()):
            roots.append(root)
    return roots


def lease_job(ctx: Context, job_id: str, generation: int) -> dict[str, Any]:
    """The slot's job description, refused unless it is this lease's."""
    job = read_job(ctx.slot_dir)
    if job.get("job_id") != job_id or job.get("generation") != generation:
        raise ToolFailed("the slot's job description belongs to another lease")
    return job


def sandbox_view(
    ctx: Context, job: dict[str, Any]
) -> tuple[sandbox.SlotLayout, dict[str, str], Environment | None]:
    """The slot's layout, extra variables and environment for a command of ``job``.

    A job with a built environment sees it read-only at the path it was built at, with
    ``$ENV/bin`` leading ``PATH`` and ``VIRTUAL_ENV`` set (docs/architecture.md
    §Environments).
    """
    layout = ctx.layout
    env = environment_of(ctx.settings.home, job)
    if env is None:
        return layout, {}, None
    layout = dataclasses.replace(layout, binds=(*layout.binds, env.bind))
    return layout, dict(env.variables), env


def run_tests(ctx: Context, args: Any, *, job_id: str, generation: int) -> dict[str, Any]:
    job = lease_job(ctx, job_id, generation)
    argv = job.get("test_command")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ToolFailed("the job has no test_command (an argv list)")
    timeout_s = float(job.get("test_timeout_s", 120.0))
    limits = sandbox.Limits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)))
    layout, variables, env = sandbox_view(ctx, job)
    result = sandbox.run(
        argv,
        ctx.work,
        mode=ctx.settings.sandbox,
        limits=limits,
        hide=[ctx.settings.home],
        expose=interpreter_roots(argv[0], ctx.settings.home),
        env=variables,
        layout=layout,
    )
    reply = {
        "exit_code": result.exit_code,
        "passed": result.exit_code == 0 and not result.timed_out,
        "timed_out": result.timed_out,
        "killed_signal": result.killed_signal,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "output_truncated": result.output_truncated,
        "sandbox": result.mode,
        "sandbox_warning": result.warning,
        "duration_ms": round(result.duration_ms, 1),
    }
    if env is not None:
        reply["environment"] = env.key
    return reply
