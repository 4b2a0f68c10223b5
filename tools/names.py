"""The tools' names and which of them mutate the tree, with nothing else imported.

``tools.registry`` declares each tool with its argument and result models, which costs
about half a second of pydantic at import; a reader that only needs to know whether a
logged call could have changed a tree (``ops detect``, a short-lived process per run)
imports this instead. The registry checks at import that its declarations agree.
"""

from __future__ import annotations

from typing import Final

READ_ONLY_TOOLS: Final = frozenset({"read_file", "list_dir", "git_status"})
MUTATING_TOOLS: Final = frozenset(
    {"write_file", "apply_patch", "rm", "mv", "git_commit", "run_tests", "exec"}
)
