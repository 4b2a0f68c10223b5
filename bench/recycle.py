"""Recycling a slot for the next job against a bare git reset of a plain clone.

Subject: ``SlotPool.lease`` + ``Workspaces.prepare`` to the other of two bases (the
worktree reset, cleaned, checked pristine, and the ``start`` snapshot committed)
+ ``SlotPool.release``: what every job pays before its first tool call and after its
last. Baseline: ``git checkout --force --detach <commit>`` + ``git reset --hard`` +
``git clean -ffdx`` of the same commit in a plain clone.

Both trees are dirtied the same way before every operation, untimed (the previous
job's leftovers: tracked files edited, untracked files and a build directory
written). The repository is generated: 2,000 files / 20 MB over two commits in the
full run (400 files / 4 MB with ``--quick``), the second commit changing a tenth of
the files.

Goal: the recycle costs at most 1.5x the bare git reset.
"""

from __future__ import annotations

from pathlib import Path

import redis

from bench.fixtures import Context, generate_repo, git, git_reset, settings_for
from bench.stats import BenchResult, Figure, Goal, Run, cost_ratio, interleave, summarize, timed
from runner.core.logs import EventLog
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces

GOAL = Goal("<=", 1.5, "<= 1.5x bare git checkout + clean + reset")


def _dirty(work_tree: str, i: int) -> None:
    """What a job leaves behind: 3 tracked files edited, 5 new files, a build dir."""
    work = Path(work_tree)
    tracked = sorted((work / "src" / "pkg00").glob("*.py"))[:3]
    for path in tracked:
        path.write_text(f"# edited by job {i}\n")
    for k in range(5):
        (work / f"notes_{k}.md").write_text(f"job {i} note {k}\n")
    build = work / "build" / "lib"
    build.mkdir(parents=True, exist_ok=True)
    for k in range(20):
        (build / f"out_{k}.o").write_bytes(b"\0" * 4096)


def run(ctx: Context) -> BenchResult:
    result = BenchResult("recycle")
    reps, n = ctx.pick(3, 5), ctx.pick(3, 8)
    files, size = (400, 4_000_000) if ctx.quick else (2_000, 20_000_000)
    work = ctx.dir("recycle")
    ctx.log(f"recycle: generating a repository of {files} files / {size / 1e6:.0f} MB")
    repo = generate_repo(work / "repo", files, size)
    settings = settings_for(work / "home", ctx.redis_url, slots=1, name="recycle")
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    pool = SlotPool(settings, client, EventLog(settings))
    workspaces = Workspaces(settings.home)
    slot_dir = settings.slots_dir / "S0"
    clone = work / "clone"
    git(work, "clone", "-q", "--no-checkout", str(repo.path), str(clone))
    git(clone, "checkout", "-q", "--detach", repo.base_a)
    bases = (repo.base_b, repo.base_a)  # each op moves to the other base
    jobs = 0

    def recycle_op(i: int) -> None:
        nonlocal jobs
        jobs += 1
        job_id = f"recycle-{jobs}"
        stamp = pool.lease(job_id, 1, wait_s=5.0)
        workspaces.prepare(slot_dir, str(repo.path), bases[i % 2], job_id)
        pool.release(stamp.slot_id, job_id, stamp.generation)

    def bare_op(i: int) -> None:
        git_reset(clone, bases[i % 2])

    def dirty_slot(i: int) -> None:
        _dirty(str(slot_dir / "work"), i)

    def dirty_clone(i: int) -> None:
        _dirty(str(clone), i)

    try:
        # Warm-up: the slot's cache clone and worktree exist, page cache is hot.
        for i in range(2):
            recycle_op(i)
            bare_op(i)
        if n % 2:
            n += 1  # even, so both bases are visited equally and each run starts at base_b

        def subject(_: int) -> Run:
            return timed(n, recycle_op, before=dirty_slot)

        def baseline(_: int) -> Run:
            return timed(n, bare_op, before=dirty_clone)

        runs = interleave(reps, {"subject": subject, "baseline": baseline})
    finally:
        client.close()
    ratio, low, high = cost_ratio(runs["subject"], runs["baseline"])
    result.figures.append(
        Figure(
            name="recycle.slot",
            what=f"recycle one slot to the other base ({repo.files} files, "
            f"{repo.size_bytes / 1e6:.1f} MB work tree)",
            subject_label="lease + prepare (reset, clean, check, start snapshot) + release",
            baseline_label="git checkout -f + reset --hard + clean -ffdx in a plain clone",
            unit="recycles/s",
            subject=summarize(runs["subject"]),
            baseline=summarize(runs["baseline"]),
            ratio=ratio,
            ratio_means="subject time per recycle / baseline time per recycle",
            spread=(low, high),
            goal=GOAL,
        )
    )
    result.notes.append(
        f"{reps} repetitions of {n} recycles per arm, interleaved, alternating between two "
        f"commits {repo.base_a[:10]} and {repo.base_b[:10]}; each tree dirtied (untimed) first."
    )
    return result
