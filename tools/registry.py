"""Every tool, declared once: name, mutating or not, retry class, argument and result models.

The retry classifier (``tools.classifier``) reads ``retry_class`` from here; the
server validates arguments with ``args_model``, and its published OpenAPI schema
(``tools.server.openapi``) and MCP's ``tools/list`` describe both models; the client
and the envelope hook read ``mutating``. A tool that is not in :data:`TOOLS` does not
exist: the server answers 404 ``unknown_tool`` and the classifier answers
``do_not_retry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tools import names

# Size limits. A write or a patch larger than this is refused with 413 before any
# byte reaches the slot; 16 MiB of source is far past what an agent writes in one call.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_PATCH_BYTES = 16 * 1024 * 1024
MAX_PATH_CHARS = 4096
MAX_MESSAGE_CHARS = 64 * 1024
# exec (docs/architecture.md §Exec tool): the command's length, its wall-clock bound
# (a default, and the server's maximum: a larger timeout_s is refused, not cut), and
# the output kept (head and tail, the middle dropped), in the reply and in the receipt
# alike, so a replay answers exactly what the first call did and a receipt line stays
# small.
MAX_COMMAND_CHARS = 64 * 1024
DEFAULT_EXEC_TIMEOUT_S = 60.0
MAX_EXEC_TIMEOUT_S = 600.0
EXEC_OUTPUT_BYTES = 32 * 1024


class RetryClass(StrEnum):
    """How a tool may be retried after a transport failure (docs/architecture.md §Retry table)."""

    MUTATING = "mutating"  # never transport-retried once a byte was sent
    READ = "read"  # 429 -> Retry-After; 5xx/timeout -> once
    TESTS = "tests"  # 429 -> only with a receipt; otherwise not at all
    EXEC = "exec"  # never once sent; a lost outcome is settled from the receipt


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# How a path is given, in every tool's JSON schema (tools.server.mcp).
_PATH = "a path relative to the work tree's root, such as src/app.py"


class PathArgs(_Args):
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS, description=_PATH)


class ListDirArgs(_Args):
    path: str = Field(default=".", min_length=1, max_length=MAX_PATH_CHARS, description=_PATH)


class NoArgs(_Args):
    pass


class WriteFileArgs(_Args):
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS, description=_PATH)
    content: str = Field(max_length=MAX_FILE_BYTES, description="the file's whole new text")


class ApplyPatchArgs(_Args):
    patch: str = Field(
        min_length=1, max_length=MAX_PATCH_BYTES, description="a unified diff (git diff)"
    )


class MoveArgs(_Args):
    src: str = Field(min_length=1, max_length=MAX_PATH_CHARS, description=_PATH)
    dst: str = Field(min_length=1, max_length=MAX_PATH_CHARS, description=_PATH)


class CommitArgs(_Args):
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="the message")


class ExecArgs(_Args):
    command: str = Field(
        min_length=1,
        max_length=MAX_COMMAND_CHARS,
        description="a bash command line, run with bash -c in the work tree's root",
    )
    timeout_s: float = Field(
        default=DEFAULT_EXEC_TIMEOUT_S,
        gt=0,
        le=MAX_EXEC_TIMEOUT_S,
        strict=True,  # a number, not "5" and not true
        allow_inf_nan=False,
        description=f"wall-clock seconds before the command is killed (at most "
        f"{MAX_EXEC_TIMEOUT_S:g})",
    )

    @field_validator("command")
    @classmethod
    def _runnable(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        if not value.strip():
            raise ValueError("must not be blank")
        return value


# -- results: what each tool answers in ``result`` (the published schema's models,
# docs/architecture.md §Tool API; tests/tools/server/test_schema.py checks each tool's
# real result against its model).


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadFileResult(_Result):
    path: str
    content: str = Field(description="the file's text (undecodable bytes replaced when binary)")
    size: int = Field(ge=0, description="the file's size in bytes")
    binary: bool = Field(default=False, description="present (true) when not UTF-8")


class DirEntry(_Result):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int = Field(ge=0, description="bytes for a file, 0 otherwise")


class ListDirResult(_Result):
    path: str
    entries: list[DirEntry] = Field(description="sorted by name; .git names left out")


class GitStatusResult(_Result):
    status: str = Field(description="git status --porcelain=v1 --untracked-files=all")


class WriteFileResult(_Result):
    path: str
    bytes: int = Field(ge=0)
    digest: str = Field(description="sha256 hex of the content written")


class ApplyPatchResult(_Result):
    files: list[str] = Field(description="every path the patch names")
    patch_sha256: str


class RmResult(_Result):
    path: str
    removed: bool


class MvResult(_Result):
    src: str
    dst: str


class GitCommitResult(_Result):
    commit: str = Field(description="the new HEAD")


class RunTestsResult(_Result):
    exit_code: int | None
    passed: bool
    timed_out: bool
    killed_signal: int | None
    stdout: str
    stderr: str
    output_truncated: bool
    sandbox: str = Field(description="bwrap, or none with the sandbox off")
    sandbox_warning: str | None
    duration_ms: float
    environment: str | None = Field(
        default=None, description="the key of the job's built environment, when it has one"
    )


class ExecResult(_Result):
    exit_code: int = Field(description="what $? would say: the status, or 128 + the signal")
    output: str = Field(description="stdout and stderr merged, head and tail kept")
    truncated: bool
    timed_out: bool
    duration_ms: float
    sandbox: str = Field(description="bwrap, or none with the sandbox off")
    sandbox_warning: str | None = Field(default=None, description="present when the run had one")
    environment: str | None = Field(
        default=None, description="the key of the job's built environment, when it has one"
    )


class ToolFailure(_Result):
    """A tool that ran and failed for good (its receipt ``failed``, the tree unchanged)."""

    error: str


@dataclass(frozen=True)
class ToolSpec:
    name: str
    mutating: bool
    retry_class: RetryClass
    args_model: type[_Args]
    result_model: type[_Result]


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec("read_file", False, RetryClass.READ, PathArgs, ReadFileResult),
        ToolSpec("list_dir", False, RetryClass.READ, ListDirArgs, ListDirResult),
        ToolSpec("git_status", False, RetryClass.READ, NoArgs, GitStatusResult),
        ToolSpec("write_file", True, RetryClass.MUTATING, WriteFileArgs, WriteFileResult),
        ToolSpec("apply_patch", True, RetryClass.MUTATING, ApplyPatchArgs, ApplyPatchResult),
        ToolSpec("rm", True, RetryClass.MUTATING, PathArgs, RmResult),
        ToolSpec("mv", True, RetryClass.MUTATING, MoveArgs, MvResult),
        ToolSpec("git_commit", True, RetryClass.MUTATING, CommitArgs, GitCommitResult),
        # Tests can write caches and build outputs into the tree: mutating.
        ToolSpec("run_tests", True, RetryClass.TESTS, NoArgs, RunTestsResult),
        # Any command: mutating, and never run twice for one key.
        ToolSpec("exec", True, RetryClass.EXEC, ExecArgs, ExecResult),
    )
}

MUTATING_TOOLS = frozenset(name for name, spec in TOOLS.items() if spec.mutating)
if MUTATING_TOOLS != names.MUTATING_TOOLS or set(TOOLS) - MUTATING_TOOLS != names.READ_ONLY_TOOLS:
    raise RuntimeError("tools/names.py disagrees with the tools declared in tools/registry.py")

# What a model reads about each tool (MCP ``tools/list``, tools.server.mcp); the
# arguments' own descriptions are in the argument models' JSON schema.
DESCRIPTIONS: dict[str, str] = {
    "read_file": "Read a file of the work tree (path relative to its root); returns its content.",
    "list_dir": "List a directory of the work tree (default: its root).",
    "git_status": "git status --porcelain of the work tree: what changed since the last commit.",
    "write_file": "Create or replace a file of the work tree with the given content.",
    "apply_patch": "Apply a unified diff (as `git diff` writes it) to the work tree.",
    "rm": "Delete a file of the work tree.",
    "mv": "Rename or move a file inside the work tree.",
    "git_commit": "Commit every change of the work tree (git add -A) with the given message.",
    "run_tests": "Run the job's own test command in the sandbox; returns exit code and output.",
    "exec": "Run a bash command in the work tree, sandboxed (no network, time-bounded); "
    "returns exit_code and output (stdout and stderr merged). Background processes "
    "are killed when the command returns.",
}


def describe(name: str) -> str:
    """The model-facing description of a registered tool."""
    return DESCRIPTIONS.get(name, name)


def get(name: str) -> ToolSpec | None:
    return TOOLS.get(name)


# Beyond an exec's own timeout_s: the sandbox's start, its kill and the receipt writes.
EXEC_REPLY_MARGIN_S = 30.0


def reply_timeout_s(tool: str, args: Any) -> float | None:
    """How long a caller waits for the reply of a call that may outlast its default
    read timeout (an ``exec`` runs up to its ``timeout_s``); None for every other call."""
    if tool != "exec" or not isinstance(args, dict):
        return None
    wanted = args.get("timeout_s", DEFAULT_EXEC_TIMEOUT_S)
    if isinstance(wanted, bool) or not isinstance(wanted, int | float):
        return None  # the server refuses it at once (422)
    return min(float(wanted), MAX_EXEC_TIMEOUT_S) + EXEC_REPLY_MARGIN_S
