"""The e2e benchmark's in-process arm: the same jobs without Celery, HTTP or slot pool.

Two threads (lanes), each with a plain clone reset per job, call ``tools.builtin``
directly, with ``ReceiptStore`` begin/finish around each mutating call: what the
job's tool work costs with no orchestration around it.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from bench.e2e_job import LANES, STEPS, TEST_COMMAND
from bench.fixtures import Context, git, git_reset, settings_for
from bench.stats import BenchError, Run
from tools import builtin, registry
from tools.receipts.store import ReceiptStore, Status


class InProcess:
    """The same jobs with no Celery, HTTP or slot pool: tools and receipts called directly."""

    def __init__(self, ctx: Context, repo: Path, base: str, sandbox: str) -> None:
        work = ctx.dir("e2e/inproc")
        self.base = base
        self.settings = settings_for(
            work / "home", ctx.redis_url, slots=LANES, sandbox=sandbox, name="e2e-inproc"
        )
        self.lanes: list[tuple[Path, ReceiptStore]] = []
        for i in range(LANES):
            lane = self.settings.slots_dir / f"L{i}"
            lane.mkdir(parents=True)
            git(lane, "clone", "-q", str(repo), "work")
            self.lanes.append((lane, ReceiptStore(lane)))

    def job(self, lane: Path, store: ReceiptStore, job_id: str) -> None:
        work = lane / "work"
        git_reset(work, self.base)
        builtin.write_job(
            lane,
            {"job_id": job_id, "generation": 1, "test_command": TEST_COMMAND,
             "test_timeout_s": 120.0},
        )  # fmt: skip
        tool_ctx = builtin.Context(lane, self.settings)
        for index, step in enumerate(STEPS):
            tool = step["tool"]
            spec = registry.TOOLS[tool]
            args = spec.args_model.model_validate(step["args"])
            if not spec.mutating:
                getattr(builtin, tool)(tool_ctx, args)
                continue
            began = store.begin(
                key=f"{job_id}:s{index}", job_id=job_id, attempt=1, slot_id=lane.name,
                generation=1, tool=tool,
            )  # fmt: skip
            if tool == "run_tests":
                out = builtin.run_tests(tool_ctx, args, job_id=job_id, generation=1)
                if not out["passed"]:
                    raise BenchError(f"in-process run_tests failed: {out['stderr'][-300:]}")
            else:
                out = getattr(builtin, tool)(tool_ctx, args)
            store.finish(began.receipt, Status.APPLIED, result={"ok": True})

    def batch(self, job_ids: list[str]) -> Run:
        todo: queue.Queue[str] = queue.Queue()
        for job_id in job_ids:
            todo.put(job_id)
        durations: list[float] = []
        errors: list[BaseException] = []

        def lane_loop(lane: Path, store: ReceiptStore) -> None:
            while True:
                try:
                    job_id = todo.get_nowait()
                except queue.Empty:
                    return
                start = time.perf_counter()
                try:
                    self.job(lane, store, job_id)
                except BaseException as exc:  # surfaced in the caller's thread
                    errors.append(exc)
                    return
                durations.append(time.perf_counter() - start)

        threads = [threading.Thread(target=lane_loop, args=lane) for lane in self.lanes]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        if errors:
            raise errors[0]
        return Run(tuple(durations), wall, len(job_ids))
