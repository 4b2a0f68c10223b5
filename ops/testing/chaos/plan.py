"""The chaos campaign's plan: which jobs run which steps, and which faults hit where.

Pure: everything is drawn from ``random.Random(seed)``, so one seed always gives the
same jobs and the same faults (what the run's interleavings then do with them is
the campaign's to record). A fault is placed on one *step* of one job -- the first
attempt that reaches that step's tool call meets it -- or, for a cancel, before the
job starts (``step == -1``).

Every job is a scripted agent over one small repository: 6-10 calls of
read_file, write_file, apply_patch, mv, rm, git_commit, run_tests (a tiny real check
of the tree) and git_status. Each read-only tool appears at most once in a job, so
"the job's git_status" names one step exactly; a mutating step is named by the
``:s{index}:`` part of its idempotency key.

``exec_orphan`` is planted in the job itself: one more step, the job's last, an
``exec`` whose command starts processes meant to outlive it (a background job,
``setsid``, ``nohup``) and to write into the tree a few seconds later, when the slot
already serves the next job. It is drawn from a random stream of its own, after the
other faults, so adding it changed no plan of the kinds that came before it.
"""

from __future__ import annotations

import difflib
import random
from collections import Counter
from collections.abc import Sequence
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
KILLS = (KILL_BEFORE_SEND, KILL_BEFORE_REPLY, KILL_AFTER_REPLY)
# At most this many of a kind per seed: each one costs a slot, a restart or a pause.
_CAP = {
    FSYNC_EIO: 1,
    SERVER_CRASH: 2,
    PAUSE: 2,
    SLOW_REDELIVERY: 2,
    STORM_429: 2,
    REDIS_WIPE: 1,
}
# These end the job's attempt for good (it fails or is cancelled): a job that has one
# has no other fault, which its later steps would never meet.
_EXCLUSIVE = frozenset({FSYNC_EIO, CANCEL_STORM})
# Faults per job at most, and the share of jobs hit beyond one fault of every kind.
_PER_JOB = 2
_RATE = 0.6

EFFECT_TOOLS = frozenset({"write_file", "apply_patch", "mv", "rm", "git_commit"})
READ_TOOLS = frozenset({"read_file", "git_status"})
# What an orphan writes, and what names its processes: checks.exec_orphans looks for it.
ORPHAN_MARK = "chaos-orphan-"
ORPHAN_DELAY_S = 3  # the write is due once the slot serves the next job
_ORPHANS_MAX = 2
VALUES = "data/values.txt"
BASE_FILES: dict[str, str] = {
    "README.md": "chaos sample repository\n",
    VALUES: "".join(f"{n}\n" for n in range(1, 10)),
    "docs/old.md": "to be moved\n",
    **{f"scratch/s{n}.txt": f"scratch {n}\n" for n in range(3)},
    "src/app.py": "def answer():\n    return 42\n",
}
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


def make_plan(
    seed: int, n_jobs: int, kinds: Sequence[str] = KINDS, *, visibility_s: float = 3.0
) -> Plan:
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    if n_jobs < 1:
        raise ValueError("a campaign needs at least one job")
    rng = random.Random(seed)
    jobs = [_job(rng, seed, i) for i in range(n_jobs)]
    faults = _faults(rng, jobs, [k for k in KINDS if k in kinds and k != EXEC_ORPHAN])
    if EXEC_ORPHAN in kinds:
        faults += _plant_orphans(random.Random(f"{seed}:{EXEC_ORPHAN}"), jobs, faults)
    slow = {f.job for f in faults if f.kind == SLOW_REDELIVERY}
    jobs = [
        JobPlan(j.index, j.job_id, j.steps, visibility_s + 8.0) if j.index in slow else j
        for j in jobs
    ]
    return Plan(seed, tuple(jobs), tuple(faults))


# -- jobs -------------------------------------------------------------------------


def _job(rng: random.Random, seed: int, index: int) -> JobPlan:
    kinds = ["write_file", "apply_patch", "run_tests"]
    optional = ["read_file", "git_status", "write_file", "apply_patch", "mv", "rm", "git_commit"]
    kinds += rng.sample(optional, rng.randint(3, len(optional)))
    rng.shuffle(kinds)
    values = BASE_FILES[VALUES].splitlines(keepends=True)
    steps: list[dict[str, Any]] = []
    notes = 0
    for tool in kinds:
        if tool == "read_file":
            args: dict[str, Any] = {"path": rng.choice(["README.md", VALUES])}
        elif tool == "write_file":
            notes += 1
            args = {
                "path": f"notes/job-{index:02d}-{notes}.md",
                "content": f"seed {seed} job {index} note {notes}: {rng.getrandbits(32):08x}\n",
            }
        elif tool == "apply_patch":
            line = rng.randrange(len(values))
            new = [*values[:line], f"{rng.randint(100, 999)}\n", *values[line + 1 :]]
            args = {"patch": unified_diff(VALUES, values, new)}
            values = new
        elif tool == "mv":
            args = {"src": "docs/old.md", "dst": f"docs/moved-{index:02d}.md"}
        elif tool == "rm":
            args = {"path": f"scratch/s{rng.randrange(3)}.txt"}
        elif tool == "git_commit":
            args = {"message": f"chaos job {index}"}
        else:
            args = {}
        steps.append({"tool": tool, "args": args})
    return JobPlan(index, f"chaos{seed}-{index:02d}", tuple(steps))


def orphan_command(job_id: str) -> str:
    """Processes that outlive the command if nothing ends them, each writing later."""
    mark, d = f"{ORPHAN_MARK}{job_id}", ORPHAN_DELAY_S
    return (
        f"( sleep {d}; echo late > {mark}-bg.txt; sleep 600 ) & "
        f"setsid bash -c 'sleep {d}; echo late > {mark}-setsid.txt; sleep 600' & "
        f"nohup bash -c 'sleep {d}; echo late > {mark}-nohup.txt; sleep 600' "
        ">/dev/null 2>&1 & echo started"
    )


def _plant_orphans(
    rng: random.Random, jobs: list[JobPlan], placed: list[FaultPlan]
) -> list[FaultPlan]:
    """An exec step at the end of jobs that have room for one more fault and that no
    exclusive fault ends first, the earlier ones preferred (more jobs come after)."""
    per_job = Counter(f.job for f in placed)
    taken = {f.job for f in placed if f.kind in _EXCLUSIVE or f.kind == SLOW_REDELIVERY}
    taken |= {job for job, n in per_job.items() if n >= _PER_JOB}
    free = [j.index for j in jobs if j.index not in taken]
    early = free[: max(1, (len(free) + 1) // 2)]
    count = min(_ORPHANS_MAX, max(1, round(len(jobs) * 0.1)), len(early))
    planted: list[FaultPlan] = []
    for index in sorted(rng.sample(early, count)):
        job = jobs[index]
        step = {"tool": "exec", "args": {"command": orphan_command(job.job_id)}}
        jobs[index] = JobPlan(job.index, job.job_id, (*job.steps, step), job.test_sleep_s)
        fault_id = len(placed) + len(planted)
        planted.append(FaultPlan(fault_id, EXEC_ORPHAN, index, len(job.steps), "exec"))
    return planted


def unified_diff(path: str, old: list[str], new: list[str]) -> str:
    """A patch as ``git diff`` writes it, from lines that end in newlines."""
    body = difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=3)
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


# -- faults -------------------------------------------------------------------------


def _faults(rng: random.Random, jobs: list[JobPlan], kinds: list[str]) -> list[FaultPlan]:
    if not kinds:
        return []
    # Every kind at least once (the exclusive ones first: they need a job to themselves),
    # then more drawn at random.
    wanted = sorted(kinds, key=lambda k: k not in _EXCLUSIVE)
    extra = max(0, round(len(jobs) * _RATE) - len(wanted))
    wanted += [rng.choice(kinds) for _ in range(extra)]
    used: set[tuple[int, int]] = set()
    per_job: dict[int, int] = {}
    placed: list[FaultPlan] = []
    for kind in wanted:
        if sum(f.kind == kind for f in placed) >= _CAP.get(kind, len(jobs)):
            continue
        spot = _place(rng, jobs, kind, used, per_job, placed)
        if spot is None:
            continue
        job, step = spot
        used.add((job, step))
        per_job[job] = per_job.get(job, 0) + 1
        plan = FaultPlan(len(placed), kind, job, step, jobs[job].tool(step), _params(rng, kind))
        placed.append(plan)
    return placed


def _place(
    rng: random.Random,
    jobs: list[JobPlan],
    kind: str,
    used: set[tuple[int, int]],
    per_job: dict[int, int],
    placed: list[FaultPlan],
) -> tuple[int, int] | None:
    """A free (job, step) that suits ``kind``, or None when there is none."""
    order = list(range(len(jobs)))
    if kind == REPLAY_STALE:
        # An early job: its slot is recycled to a later one before the replay lands.
        order = order[: max(1, len(jobs) // 2)]
    elif kind == CANCEL_STORM:
        order = order[len(jobs) // 2 :] or order
    rng.shuffle(order)
    slow = {f.job for f in placed if f.kind == SLOW_REDELIVERY}
    exclusive = {f.job for f in placed if f.kind in _EXCLUSIVE}
    for job in order:
        if per_job.get(job, 0) >= _PER_JOB or job in exclusive:
            continue
        if (kind == SLOW_REDELIVERY and job in slow) or (kind in _EXCLUSIVE and job in per_job):
            continue
        steps = [i for i in _steps_for(kind, jobs[job], rng) if (job, i) not in used]
        if steps:
            return job, rng.choice(steps)
    return None


def _steps_for(kind: str, job: JobPlan, rng: random.Random) -> list[int]:
    tools = [str(s["tool"]) for s in job.steps]
    every = list(range(len(tools)))
    if kind in (SERVER_CRASH, LOSE_RESPONSE, FSYNC_EIO, REDIS_WIPE):
        return [i for i in every if tools[i] in EFFECT_TOOLS]
    if kind == REPLAY_STALE:
        return [i for i in every if tools[i] in ("write_file", "apply_patch")]
    if kind == SLOW_REDELIVERY:
        return [i for i in every if tools[i] == "run_tests"]
    if kind == CANCEL_STORM:
        # Before it starts, mid-job, or on its last call (racing its completion).
        return [rng.choice([-1, rng.randrange(len(tools)), len(tools) - 1])]
    return every


def _params(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == HTTP_429:
        # A mutating call is resent at most three times after a 429 (tools.client).
        return {"times": rng.randint(1, 3), "retry_after_s": 1}
    if kind == STORM_429:
        return {"times": rng.randint(4, 8), "retry_after_s": 1}
    if kind == CANCEL_STORM:
        return {"repeats": rng.randint(2, 4)}
    return {}
