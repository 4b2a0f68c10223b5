"""One ``write_file`` through the whole pipeline against a bare HTTP call plus one fsync.

Subject: ``ToolClient.call`` (local envelope check against the stamp, the classifier
on the retry path, HTTP) to the real tool server process (envelope hook under the
slot lock, receipt intent and outcome each appended and fsynced, the file written,
one JSON log line) -- every call a fresh idempotency key, so every call applies.

Baseline: a bare ``httpx`` POST of the same body to a no-op endpoint on a FastAPI
server started the same way (``bench.noop_server``), then one ``os.write`` +
``os.fsync`` of a small record: the least a durable remote call can cost.

A third arm, reported without a goal, splits the cost: the same call straight into
``ToolService.call`` in the benchmark's own process (hook, slot lock, receipts, the
write; no HTTP, no client, no log line) against the same baseline.

Goal: the subject costs at most 1.5x the baseline per call.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import httpx

from bench.fixtures import Context, lease_slot, make_repo, noop_server, settings_for, toolserver
from bench.machine import vm_hwm_mb
from bench.stats import BenchResult, Figure, Goal, Run, cost_ratio, interleave, summarize, timed
from tools.client import ToolClient
from tools.envelope import Envelope
from tools.server.service import ToolService

GOAL = Goal("<=", 1.5, "<= 1.5x the bare baseline")
CONTENT = "x = 1  # written by the pipeline benchmark\n"


def run(ctx: Context) -> BenchResult:
    result = BenchResult("pipeline")
    reps, n = ctx.pick(3, 7), ctx.pick(60, 400)
    work = ctx.dir("pipeline")
    settings = settings_for(work / "home", ctx.redis_url, name="pipeline")
    with contextlib.ExitStack() as stack:
        settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        noop_url, noop = noop_server(work / "logs")
        stack.callback(noop.stop)
        base = make_repo(work / "repo", {"pkg/lock.py": "held_by = None\n", "README": "x\n"})
        stamp, slot_dir = lease_slot(settings, work / "repo", base, "bench-pipeline")
        assert stamp.job_id is not None and stamp.attempt is not None

        client = ToolClient(settings.toolserver_url, timeout_s=30)
        stack.callback(client.close)
        bare = httpx.Client(base_url=noop_url, timeout=30, transport=httpx.HTTPTransport(retries=0))
        stack.callback(bare.close)
        fd = os.open(work / "baseline.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stack.callback(os.close, fd)

        calls = 0

        def envelope(key: str) -> Envelope:
            assert stamp.job_id is not None and stamp.attempt is not None
            return Envelope(
                job_id=stamp.job_id,
                attempt=stamp.attempt,
                slot_id=stamp.slot_id,
                generation=stamp.generation,
                tool="write_file",
                idempotency_key=key,
            )

        def args(i: int) -> dict[str, Any]:
            return {"path": f"bench/out_{i % 16}.py", "content": CONTENT}

        def subject_call(i: int) -> None:
            nonlocal calls
            calls += 1
            response = client.call(envelope(f"bench-pipeline:{calls}"), args(i), slot_dir=slot_dir)
            if response.replayed or (response.receipt or {}).get("status") != "applied":
                raise RuntimeError(f"write_file did not apply: {response}")

        def baseline_call(i: int) -> None:
            nonlocal calls
            calls += 1
            body = {"envelope": envelope(f"bench-noop:{calls}").model_dump(), "args": args(i)}
            response = bare.post("/v1/tools/write_file", json=body)
            response.raise_for_status()
            line = (response.text + "\n").encode()
            os.write(fd, line)
            os.fsync(fd)

        # Warm both sides: connections, imports, the receipt file and the log file exist.
        timed(10, subject_call)
        timed(10, baseline_call)

        service = ToolService(settings)

        def service_call(i: int) -> None:
            nonlocal calls
            calls += 1
            body = {"envelope": envelope(f"bench-service:{calls}").model_dump(), "args": args(i)}
            reply = service.call("write_file", body)
            if reply.http_status != 200 or reply.outcome != "applied":
                raise RuntimeError(f"in-process write_file did not apply: {reply}")

        timed(10, service_call)

        def subject(_: int) -> Run:
            return timed(n, subject_call)

        def baseline(_: int) -> Run:
            return timed(n, baseline_call)

        runs = interleave(
            reps,
            {"subject": subject, "baseline": baseline, "service": lambda _: timed(n, service_call)},
        )
        ratio, low, high = cost_ratio(runs["subject"], runs["baseline"])
        result.figures.append(
            Figure(
                name="pipeline.write_file",
                what="one write_file call, full pipeline vs bare POST + one fsync",
                subject_label="ToolClient -> tool server (hook, 2 receipt fsyncs, log line)",
                baseline_label="httpx POST to a no-op FastAPI endpoint + write + fsync",
                unit="calls/s",
                subject=summarize(runs["subject"]),
                baseline=summarize(runs["baseline"]),
                ratio=ratio,
                ratio_means="subject time per call / baseline time per call",
                spread=(low, high),
                goal=GOAL,
            )
        )
        ratio, low, high = cost_ratio(runs["service"], runs["baseline"])
        result.figures.append(
            Figure(
                name="pipeline.service_in_process",
                what="the server's share: ToolService.call in this process vs the same baseline",
                subject_label="ToolService.call (hook, slot lock, 2 receipt fsyncs, write)",
                baseline_label="httpx POST to a no-op FastAPI endpoint + write + fsync",
                unit="calls/s",
                subject=summarize(runs["service"]),
                baseline=summarize(runs["baseline"]),
                ratio=ratio,
                ratio_means="in-process service time per call / baseline time per call (no goal)",
                spread=(low, high),
            )
        )
        server_peak = vm_hwm_mb(server.pid)
        noop_peak = vm_hwm_mb(noop.pid)
        if server_peak is not None:
            ctx.memory["toolserver.pipeline"] = (server_peak, f"after {calls} calls of this run")
        if noop_peak is not None:
            ctx.memory["noop_server"] = (noop_peak, "the pipeline baseline's no-op server")
        result.notes.append(
            f"{reps} repetitions of {n} calls per arm, interleaved; the server's sandbox "
            f"mode is {settings.sandbox!r}; slot {stamp.slot_id} generation {stamp.generation}."
        )
        receipts = (Path(slot_dir) / "receipts.jsonl").read_bytes().count(b"\n")
        result.notes.append(f"{receipts} receipt records were written by the subject arm.")
    return result
