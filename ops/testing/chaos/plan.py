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

With several hosts (``hosts >= 2``) the whole-host faults come last, from a stream of
their own too (``ops.testing.chaos.hostplan``), so a seed plans on N hosts the very
faults it plans on one, plus those. They are not in :data:`KINDS` (what one host
runs by default) but in :data:`HOST_KINDS`.
"""

from __future__ import annotations

import difflib
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ops.testing.chaos.hostplan import plan_host_faults
from ops.testing.chaos.kinds import (
    ALL_KINDS,
    CANCEL_STORM,
    CHECK,
    EFFECT_TOOLS,
    EXCLUSIVE,
    EXEC_ORPHAN,
    FSYNC_EIO,
    HOST_FREEZE,
    HOST_KILL,
    HOST_KINDS,
    HOST_RESTART,
    HTTP_429,
    KILL_AFTER_REPLY,
    KILL_BEFORE_REPLY,
    KILL_BEFORE_SEND,
    KILLS,
    KINDS,
    LOSE_RESPONSE,
    PAUSE,
    PER_JOB,
    READ_TOOLS,
    REDIS_WIPE,
    REPLAY_STALE,
    SERVER_CRASH,
    SLOW_REDELIVERY,
    STORM_429,
    FaultPlan,
    JobPlan,
    Plan,
)

# The vocabulary is kinds.py's; plan.py is where callers find it.
__all__ = [
    "ALL_KINDS",
    "BASE_FILES",
    "CANCEL_STORM",
    "CHECK",
    "EFFECT_TOOLS",
    "EXCLUSIVE",
    "EXEC_ORPHAN",
    "FSYNC_EIO",
    "HOST_FREEZE",
    "HOST_KILL",
    "HOST_KINDS",
    "HOST_RESTART",
    "HTTP_429",
    "KILLS",
    "KILL_AFTER_REPLY",
    "KILL_BEFORE_REPLY",
    "KILL_BEFORE_SEND",
    "KINDS",
    "LOSE_RESPONSE",
    "ORPHAN_DELAY_S",
    "ORPHAN_MARK",
    "PAUSE",
    "PER_JOB",
    "READ_TOOLS",
    "REDIS_WIPE",
    "REPLAY_STALE",
    "SERVER_CRASH",
    "SLOW_REDELIVERY",
    "STORM_429",
    "VALUES",
    "FaultPlan",
    "JobPlan",
    "Plan",
    "check_kinds",
    "make_plan",
    "orphan_command",
    "unified_diff",
]

# At most this many of a kind per seed: each one costs a slot, a restart or a pause.
_CAP = {
    FSYNC_EIO: 1,
    SERVER_CRASH: 2,
    PAUSE: 2,
    SLOW_REDELIVERY: 2,
    STORM_429: 2,
    REDIS_WIPE: 1,
}
# The share of jobs hit beyond one fault of every kind.
_RATE = 0.6

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


def make_plan(
    seed: int,
    n_jobs: int,
    kinds: Sequence[str] = KINDS,
    *,
    visibility_s: float = 3.0,
    hosts: int = 1,
) -> Plan:
    check_kinds(kinds, hosts)
    if n_jobs < 1:
        raise ValueError("a campaign needs at least one job")
    rng = random.Random(seed)
    jobs = [_job(rng, seed, i) for i in range(n_jobs)]
    faults = _faults(rng, jobs, [k for k in KINDS if k in kinds and k != EXEC_ORPHAN])
    if EXEC_ORPHAN in kinds:
        faults += _plant_orphans(random.Random(f"{seed}:{EXEC_ORPHAN}"), jobs, faults)
    if hosts > 1:
        faults += plan_host_faults(random.Random(f"{seed}:hosts"), jobs, faults, kinds, hosts)
    slow = {f.job for f in faults if f.kind == SLOW_REDELIVERY}
    jobs = [
        JobPlan(j.index, j.job_id, j.steps, visibility_s + 8.0) if j.index in slow else j
        for j in jobs
    ]
    return Plan(seed, tuple(jobs), tuple(faults))


def check_kinds(kinds: Sequence[str], hosts: int) -> None:
    """Refuse a kind that does not exist, a host fault on one host, a restart alone."""
    unknown = sorted(set(kinds) - set(ALL_KINDS))
    if unknown:
        known = ", ".join(ALL_KINDS)
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {known}")
    on_hosts = [k for k in HOST_KINDS if k in kinds]
    if on_hosts and hosts < 2:
        raise ValueError(f"{', '.join(on_hosts)} need(s) two hosts or more (--hosts 2)")
    if HOST_RESTART in kinds and HOST_KILL not in kinds:
        raise ValueError(f"{HOST_RESTART} starts a host {HOST_KILL} killed: name {HOST_KILL} too")


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
    taken = {f.job for f in placed if f.kind in EXCLUSIVE or f.kind == SLOW_REDELIVERY}
    taken |= {job for job, n in per_job.items() if n >= PER_JOB}
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
    wanted = sorted(kinds, key=lambda k: k not in EXCLUSIVE)
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
    exclusive = {f.job for f in placed if f.kind in EXCLUSIVE}
    for job in order:
        if per_job.get(job, 0) >= PER_JOB or job in exclusive:
            continue
        if (kind == SLOW_REDELIVERY and job in slow) or (kind in EXCLUSIVE and job in per_job):
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
