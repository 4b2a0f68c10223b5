"""Every tool, declared once: name, mutating or not, retry class, argument model.

The retry classifier (``tools.classifier``) reads ``retry_class`` from here; the
server validates arguments with ``args_model``; the client and the envelope hook
read ``mutating``. A tool that is not in :data:`TOOLS` does not exist: the server
answers 404 ``unknown_tool`` and the classifier answers ``do_not_retry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

# Size limits. A write or a patch larger than this is refused with 413 before any
# byte reaches the slot; 16 MiB of source is far past what an agent writes in one call.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_PATCH_BYTES = 16 * 1024 * 1024
MAX_PATH_CHARS = 4096
MAX_MESSAGE_CHARS = 64 * 1024


class RetryClass(StrEnum):
    """How a tool may be retried after a transport failure (docs/architecture.md §Retry table)."""

    MUTATING = "mutating"  # never transport-retried once a byte was sent
    READ = "read"  # 429 -> Retry-After; 5xx/timeout -> once
    TESTS = "tests"  # 429 -> only with a receipt; otherwise not at all


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PathArgs(_Args):
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


class ListDirArgs(_Args):
    path: str = Field(default=".", min_length=1, max_length=MAX_PATH_CHARS)


class NoArgs(_Args):
    pass


class WriteFileArgs(_Args):
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    content: str = Field(max_length=MAX_FILE_BYTES)


class ApplyPatchArgs(_Args):
    patch: str = Field(min_length=1, max_length=MAX_PATCH_BYTES)


class MoveArgs(_Args):
    src: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    dst: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


class CommitArgs(_Args):
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    mutating: bool
    retry_class: RetryClass
    args_model: type[_Args]


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec("read_file", False, RetryClass.READ, PathArgs),
        ToolSpec("list_dir", False, RetryClass.READ, ListDirArgs),
        ToolSpec("git_status", False, RetryClass.READ, NoArgs),
        ToolSpec("write_file", True, RetryClass.MUTATING, WriteFileArgs),
        ToolSpec("apply_patch", True, RetryClass.MUTATING, ApplyPatchArgs),
        ToolSpec("rm", True, RetryClass.MUTATING, PathArgs),
        ToolSpec("mv", True, RetryClass.MUTATING, MoveArgs),
        ToolSpec("git_commit", True, RetryClass.MUTATING, CommitArgs),
        # Tests can write caches and build outputs into the tree: mutating.
        ToolSpec("run_tests", True, RetryClass.TESTS, NoArgs),
    )
}

MUTATING_TOOLS = frozenset(name for name, spec in TOOLS.items() if spec.mutating)


def get(name: str) -> ToolSpec | None:
    return TOOLS.get(name)
