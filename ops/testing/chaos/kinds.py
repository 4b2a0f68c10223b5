"""The chaos plan's vocabulary: fault kinds, what a job and a fault are, a plan.

Apart from ``ops.testing.chaos.plan`` (which draws a plan from a seed) so that
``ops.testing.chaos.hostplan`` can build on it without the two importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fault kinds, the most important first.
KILL_BEFORE_SEND = "kill_before_send"
KILL_BEFORE_REPLY = "kill_before_reply"
KILL_AFTER_REPLY = "kill_after_reply"
SERVER_CRASH = "server_crash"
HTTP_429 = "http_429"
STORM_429 = "storm_429"
LOSE_RESPONSE = "lose_response"
SLOW_REDELIVERY = "slow_redelivery"
PAUSE = "pause"
REPLAY_STALE = "replay_stale"
CANCEL_STORM = "cancel_storm"
FSYNC_EIO = "fsync_eio"
REDIS_WIPE = "redis_wipe"
EXEC_ORPHAN = "exec_orphan"
HOST_KILL = "host_kill"
HOST_FREEZE = "host_freeze"
HOST_RESTART = "host_restart"
KINDS: tuple[str, ...] = (
    KILL_BEFORE_SEND,
    KILL_BEFORE_REPLY,
    KILL_AFTER_REPLY,
    SERVER_CRASH,
    HTTP_429,
    STORM_429,
    LOSE_RESPONSE,
    SLOW_REDELIVERY,
    PAUSE,
    REPLAY_STALE,
    CANCEL_STORM,
    FSYNC_EIO,
    REDIS_WIPE,
    EXEC_ORPHAN,
)
# Only planned on two hosts or more: a whole host SIGKILLed mid-call, SIGSTOPped past
# its jobs' heartbeats, and a killed host started again on its home.
HOST_KINDS: tuple[str, ...] = (HOST_KILL, HOST_FREEZE, HOST_RESTART)
ALL_KINDS: tuple[str, ...] = KINDS + HOST_KINDS
KILLS = (KILL_BEFORE_SEND, KILL_BEFORE_REPLY, KILL_AFTER_REPLY)

# These end the job's attempt for good (it fails or is cancelled): a job that has one
# has no other fault, which its later steps would never meet.
EXCLUSIVE = frozenset({FSYNC_EIO, CANCEL_STORM})
# Faults per job at most.
PER_JOB = 2

EFFECT_TOOLS = frozenset({"write_file", "apply_patch", "mv", "rm", "git_commit"})
READ_TOOLS = frozenset({"read_file", "git_status"})
# The test command's check: every line of data/values.txt is an integer.
CHECK = (
    "import pathlib, sys\n"
    "values = pathlib.Path('data/values.txt').read_text().split()\n"
    "sys.exit(0 if values and all(v.lstrip('-').isdigit() for v in values) else 1)\n"
)


@dataclass(frozen=True)
class JobPlan:
    index: int
    job_id: str
    steps: tuple[dict[str, Any], ...]  # {"tool", "args"}
    test_sleep_s: float = 0.0  # > 0: run_tests outlives the visibility timeout

    def test_command(self, python: str) -> list[str]:
        sleep = f"import time; time.sleep({self.test_sleep_s:g})\n" if self.test_sleep_s else ""
        return [python, "-I", "-B", "-c", sleep + CHECK]

    def tool(self, step: int) -> str:
        return str(self.steps[step]["tool"]) if step >= 0 else ""


@dataclass(frozen=True)
class FaultPlan:
    fault_id: int
    kind: str
    job: int  # index into Plan.jobs
    step: int  # -1: before the job starts
    tool: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    seed: int
    jobs: tuple[JobPlan, ...]
    faults: tuple[FaultPlan, ...]


@dataclass
class Fired:
    """What one planned fault did in a run (the report's ``fired`` list)."""

    fault_id: int
    kind: str
    job_id: str
    step: int
    tool: str
    at_s: float  # since the campaign started
    attempt: int | None = None
    detail: str = ""
    skipped: bool = False  # met, but not injected (the detail says why)
    host: str | None = None  # on several hosts: the host it hit

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "host" or v is not None}
