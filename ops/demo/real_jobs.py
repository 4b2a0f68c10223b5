"""The jobs ``slotrunner demo --real`` runs on six, and what each is expected to end as.

All three share one ``environment`` (a venv with pytest), so the first job to reach it
builds it and the others wait for that build or find it done (docs/architecture.md
§Environments). The plans are scripted: what is shown is the environment and the
fence around the tools, not a model's skill.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENVIRONMENT: dict[str, Any] = {
    "setup": [["python3", "-m", "venv", "$ENV"], ["$ENV/bin/pip", "install", "-q", "pytest"]],
}
# ``python`` is the environment's: run_tests puts ``$ENV/bin`` first on PATH.
TEST_COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_six.py"]


def byte2int_patch(old: int, new: int) -> str:
    """A patch of six 1.17.0's Python 3 ``byte2int`` from ``itemgetter(old)`` to ``(new)``."""
    return f"""diff --git a/six.py b/six.py
--- a/six.py
+++ b/six.py
@@ -654,7 +654,7 @@ if PY3:
     import struct
     int2byte = struct.Struct(">B").pack
     del struct
-    byte2int = operator.itemgetter({old})
+    byte2int = operator.itemgetter({new})
     indexbytes = operator.getitem
     iterbytes = iter
     import io
"""


# An off-by-one in six's Python 3 ``byte2int``: only ``test_byte2int`` notices.
BREAK_PATCH = byte2int_patch(0, 1)
FIX_PATCH = byte2int_patch(1, 0)

BROKEN_TEST = "test_six.py::test_byte2int"


@dataclass(frozen=True)
class Plan:
    """One job of the demo: its scripted steps and the outcome that counts as right."""

    name: str
    what: str
    steps: tuple[dict[str, Any], ...]
    state: str  # the job's expected final state
    failing: tuple[str, ...] = ()  # the tests expected to fail (none: the tests pass)


_RUN_TESTS: dict[str, Any] = {"tool": "run_tests", "args": {}}
_BREAK: dict[str, Any] = {"tool": "apply_patch", "args": {"patch": BREAK_PATCH}}
_FIX: dict[str, Any] = {"tool": "apply_patch", "args": {"patch": FIX_PATCH}}

PLANS = (
    Plan("tests", "run the tests", (_RUN_TESTS,), "succeeded"),
    # A job whose tests fail ends "failed": that is this job's right outcome.
    Plan("break", "break byte2int, run the tests", (_BREAK, _RUN_TESTS), "failed", (BROKEN_TEST,)),
    Plan(
        "break-fix",
        "break byte2int, fix it, run the tests",
        (_BREAK, _FIX, _RUN_TESTS),
        "succeeded",
    ),
)


def job_id(run_id: str, index: int) -> str:
    return f"demo-{run_id}-{index:02d}"


def specs(repo: Path, base: str, run_id: str) -> list[dict[str, Any]]:
    """The job specs of one run, in PLANS' order."""
    return [
        {
            "job_id": job_id(run_id, index),
            "eval_run": f"demo-{run_id}",
            "repo": str(repo),
            "base": base,
            "test_command": TEST_COMMAND,
            "environment": ENVIRONMENT,
            "planner": {"kind": "scripted", "steps": list(plan.steps)},
        }
        for index, plan in enumerate(PLANS)
    ]
