"""The e2e benchmark's job: 10 tool calls on a 200-file repository, and its spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LANES = 2
TEST_COMMAND = ["/bin/true"]

PATCH_LOCK = """diff --git a/pkg/lock.py b/pkg/lock.py
--- a/pkg/lock.py
+++ b/pkg/lock.py
@@ -1 +1 @@
-held_by = None
+held_by = "agent"
"""
PATCH_CONFIG = """diff --git a/pkg/config.py b/pkg/config.py
--- a/pkg/config.py
+++ b/pkg/config.py
@@ -1,2 +1,2 @@
-level = 1
+level = 2
 name = "bench"
"""
STEPS: list[dict[str, Any]] = [
    {"tool": "read_file", "args": {"path": "README"}},
    {"tool": "git_status", "args": {}},
    {"tool": "write_file", "args": {"path": "notes/plan.md", "content": "1. lock\n2. config\n"}},
    {"tool": "apply_patch", "args": {"patch": PATCH_LOCK}},
    {"tool": "read_file", "args": {"path": "pkg/lock.py"}},
    {"tool": "write_file", "args": {"path": "pkg/extra.py", "content": "EXTRA = True\n"}},
    {"tool": "apply_patch", "args": {"patch": PATCH_CONFIG}},
    {"tool": "git_status", "args": {}},
    {"tool": "write_file", "args": {"path": "notes/done.md", "content": "done\n"}},
    {"tool": "run_tests", "args": {}},
]


def repo_files() -> dict[str, str]:
    files = {
        "README": "a repository for the end-to-end benchmark\n",
        "pkg/__init__.py": "",
        "pkg/lock.py": "held_by = None\n",
        "pkg/config.py": 'level = 1\nname = "bench"\n',
    }
    for i in range(196):
        files[f"pkg/mod_{i:03d}.py"] = "".join(f"def f{k}():\n    return {k}\n" for k in range(40))
    return files


def job_spec(repo: Path, base: str, job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "eval_run": "bench-e2e",
        "repo": str(repo),
        "base": base,
        "test_command": TEST_COMMAND,
        "planner": {"kind": "scripted", "steps": STEPS},
    }
