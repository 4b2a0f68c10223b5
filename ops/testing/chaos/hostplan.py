"""Where the whole-host faults of a campaign on several hosts go (``--hosts N``, N >= 2).

A host fault sits on one step of one job, like the others: the first attempt whose
call of that step reaches *some* host's proxy takes that host down with it, since any
host's worker may take any job from the shared queue.

* ``host_kill`` -- every process of that host SIGKILLed at once, mid-call (the tool
  server dies after the call's effect, before its outcome: an open intent for the
  restarted janitor to resolve from the tree). Only on a step that changes the tree.
* ``host_restart`` -- follows one ``host_kill``, ``after_s`` seconds later (or when every
  job finished, if that comes first): the host starts again on the same home.
  Without one, the host stays dead to the end.
* ``host_freeze`` -- every process of that host SIGSTOPped until another host took the
  job over (past the heartbeat TTL), then SIGCONTed.

A live host must remain at every moment, or a job could never finish: at most
``hosts - 1`` hosts die for good, one fewer when a freeze is planned (it needs a live
host besides the frozen one), and the campaign refuses at run time to take down the
last host that is up (``ops.testing.chaos.hostfaults``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from random import Random

from ops.testing.chaos.kinds import (
    EFFECT_TOOLS,
    EXCLUSIVE,
    HOST_FREEZE,
    HOST_KILL,
    HOST_RESTART,
    PER_JOB,
    REDIS_WIPE,
    FaultPlan,
    JobPlan,
)

RESTART_AFTER_S = (3, 10)  # a killed host comes back this many seconds later
_RESTART_SHARE = 0.6  # of the kills that may stay dead, the share restarted anyway


def kills_for(hosts: int) -> int:
    return 1 if hosts == 2 else 2


def freezes_for(hosts: int, n_jobs: int) -> int:
    return 2 if hosts >= 3 and n_jobs >= 20 else 1


def plan_host_faults(
    rng: Random,
    jobs: Sequence[JobPlan],
    placed: Sequence[FaultPlan],
    kinds: Sequence[str],
    hosts: int,
) -> list[FaultPlan]:
    """The host faults of a plan whose other faults are ``placed``; none on one host."""
    if hosts < 2:
        return []
    per_job = Counter(f.job for f in placed)
    used = {(f.job, f.step) for f in placed}
    busy = {f.job for f in placed if f.kind in EXCLUSIVE or f.kind == REDIS_WIPE}
    # The earlier two thirds: jobs come after, for the hosts left and a restarted one.
    early = [j.index for j in jobs][: max(1, -(-2 * len(jobs) // 3))]
    # Jobs with room for one more fault first; when there are none (few jobs, every
    # kind), the others: a host fault takes down a host, its job is only the trigger.
    roomy = [j for j in early if j not in busy and per_job[j] < PER_JOB]
    full = [j for j in early if j not in busy and j not in roomy]
    rng.shuffle(roomy)
    rng.shuffle(full)
    free = roomy + full
    freezes = freezes_for(hosts, len(jobs)) if HOST_FREEZE in kinds else 0
    may_stay_dead = hosts - 1 - (1 if freezes else 0)
    wanted = [HOST_KILL] * (kills_for(hosts) if HOST_KILL in kinds else 0)
    wanted += [HOST_FREEZE] * freezes
    out: list[FaultPlan] = []
    dead_for_good = 0
    for kind in wanted:
        spots: list[tuple[int, int]] = []
        for job in free:
            spots = [
                (job, step)
                for step, s in enumerate(jobs[job].steps)
                if (job, step) not in used and (kind != HOST_KILL or s["tool"] in EFFECT_TOOLS)
            ]
            if spots:
                break
        if not spots:
            continue
        restart = None
        if kind == HOST_KILL:
            stays_dead = dead_for_good < may_stay_dead and rng.random() >= _RESTART_SHARE
            if HOST_RESTART not in kinds or stays_dead:
                if dead_for_good >= may_stay_dead:
                    continue  # it would leave no live host: not planned
                dead_for_good += 1
            else:
                restart = {"after_s": rng.randint(*RESTART_AFTER_S)}
        job, step = rng.choice(spots)
        free.remove(job)  # one host fault a job
        fault = FaultPlan(len(placed) + len(out), kind, job, step, jobs[job].tool(step))
        out.append(fault)
        if restart is not None:
            fault_id = len(placed) + len(out)
            params = {"kill": fault.fault_id, **restart}
            out.append(FaultPlan(fault_id, HOST_RESTART, job, step, fault.tool, params))
    return out


def stays_dead(faults: Sequence[FaultPlan]) -> list[FaultPlan]:
    """The kills that no restart follows."""
    restarted = {f.params.get("kill") for f in faults if f.kind == HOST_RESTART}
    return [f for f in faults if f.kind == HOST_KILL and f.fault_id not in restarted]
