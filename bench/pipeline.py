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

Floors (``bench.pipeline_floors``), interleaved with the arms above: the issue's own
pipeline floor, the same call with a no-op effect: ``ToolClient`` to a second tool
server on the same slot whose ``write_file`` does everything but the write (``--effect
noop`` of the test server, ``ops.testing.toolserver.NoopEffect``), what the pipeline
costs with nothing to apply. The subject is set against it; for that verdict the two
are also called in turn, one call of each at a time (``bench.stats.alternate``), since
what the write adds is smaller than one block of calls drifts from the next. Beside
it: the two-fsync HTTP floor (the baseline's POST + two receipt-sized appends and
fsyncs) and the effect floor (the same + the write's own system calls between the two
records). Five more arms, in the same rotation, make the
breakdown of where a call's time goes (the last note): GET /healthz on the no-op
server and on the tool server, read_file and write_file by a bare httpx client to the
tool server, and the subject.

Goal: the subject costs at most 1.5x the baseline per call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.fixtures import Context, lease_slot, make_repo, noop_server, settings_for, toolserver
from bench.machine import vm_hwm_mb
from bench.pipeline_floors import DiskFloor, breakdown, receipt_lines, write_file_floor
from bench.stats import (
    BenchResult,
    Figure,
    Goal,
    Run,
    alternate,
    cost_ratio,
    floor_figure,
    interleave,
    summarize,
    timed,
)
from runner.workspace.tree import WORK_DIR
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
        # The same host's slots behind a second server whose write_file writes nothing.
        noop_settings, noop_effect = toolserver(settings, work / "logs-noop", noop_effect=True)
        stack.callback(noop_effect.stop)
        base = make_repo(work / "repo", {"pkg/lock.py": "held_by = None\n", "README": "x\n"})
        stamp, slot_dir = lease_slot(settings, work / "repo", base, "bench-pipeline")
        assert stamp.job_id is not None and stamp.attempt is not None

        client = ToolClient(settings.toolserver_url, timeout_s=30)
        stack.callback(client.close)
        noop_client = ToolClient(noop_settings.toolserver_url, timeout_s=30)
        stack.callback(noop_client.close)
        bare = httpx.Client(base_url=noop_url, timeout=30, transport=httpx.HTTPTransport(retries=0))
        stack.callback(bare.close)
        direct = httpx.Client(
            base_url=settings.toolserver_url, timeout=30, transport=httpx.HTTPTransport(retries=0)
        )
        stack.callback(direct.close)
        fd = os.open(work / "baseline.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stack.callback(os.close, fd)
        floor_fd = os.open(work / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stack.callback(os.close, floor_fd)

        calls = 0

        def envelope(key: str | None, tool: str = "write_file") -> Envelope:
            assert stamp.job_id is not None and stamp.attempt is not None
            return Envelope(
                job_id=stamp.job_id,
                attempt=stamp.attempt,
                slot_id=stamp.slot_id,
                generation=stamp.generation,
                tool=tool,
                idempotency_key=key,
            )

        def args(i: int) -> dict[str, Any]:
            return {"path": f"bench/out_{i % 16}.py", "content": CONTENT}

        def tool_call(to: ToolClient, prefix: str, i: int) -> None:
            nonlocal calls
            calls += 1
            response = to.call(envelope(f"{prefix}:{calls}"), args(i), slot_dir=slot_dir)
            if response.replayed or (response.receipt or {}).get("status") != "applied":
                raise RuntimeError(f"write_file did not apply: {response}")

        def subject_call(i: int) -> None:
            tool_call(client, "bench-pipeline", i)

        def noop_effect_call(i: int) -> None:
            tool_call(noop_client, "bench-noop-effect", i)

        def noop_post(i: int) -> httpx.Response:
            nonlocal calls
            calls += 1
            body = {"envelope": envelope(f"bench-noop:{calls}").model_dump(), "args": args(i)}
            response = bare.post("/v1/tools/write_file", json=body)
            response.raise_for_status()
            return response

        def baseline_call(i: int) -> None:
            line = (noop_post(i).text + "\n").encode()
            os.write(fd, line)
            os.fsync(fd)

        def direct_call(tool: str, key: str | None, tool_args: dict[str, Any]) -> None:
            body = {"envelope": envelope(key, tool).model_dump(), "args": tool_args}
            response = direct.post(f"/v1/tools/{tool}", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"bare {tool} answered {response.status_code}: {response.text}")

        def write_bare(i: int) -> None:
            nonlocal calls
            calls += 1
            direct_call("write_file", f"bench-direct:{calls}", args(i))

        def read_bare(i: int) -> None:
            direct_call("read_file", None, {"path": args(i)["path"]})

        def healthz(client: httpx.Client) -> None:
            client.get("/healthz").raise_for_status()

        # Warm both sides: connections, imports, the receipt file and the log file exist;
        # every target file exists, so each write replaces one (as the floor's does).
        timed(16, subject_call)
        timed(16, noop_effect_call)
        timed(10, baseline_call)
        for call in (write_bare, read_bare, lambda _: healthz(direct), lambda _: healthz(bare)):
            timed(10, call)
        intent, outcome = receipt_lines(Path(slot_dir))
        tree = Path(slot_dir) / WORK_DIR
        disk = DiskFloor(floor_fd, intent, outcome, tree, "bench", CONTENT.encode())
        for i in range(16):  # the floor's own targets, beside the subject's
            (disk.work / "bench" / f"floor_{i}.py").write_bytes(disk.data)

        def floor_two_fsync(i: int) -> None:
            noop_post(i)
            disk.records()

        def floor_effect(i: int) -> None:
            noop_post(i)
            disk.records_and_effect(f"floor_{i % 16}.py")

        service = ToolService(settings)

        def service_call(i: int) -> None:
            nonlocal calls
            calls += 1
            body = {"envelope": envelope(f"bench-service:{calls}").model_dump(), "args": args(i)}
            reply = service.call("write_file", body)
            if reply.http_status != 200 or reply.outcome != "applied":
                raise RuntimeError(f"in-process write_file did not apply: {reply}")

        timed(10, service_call)

        def arm(op: Callable[[int], object]) -> Callable[[int], Run]:
            return lambda _: timed(n, op)

        # The subject and its no-op effect floor again, call by call in turn: what the
        # write adds to a call is a few tenths of a millisecond, less than one block of
        # calls drifts from the next here, so the floor's verdict pairs single calls.
        in_turn: dict[str, list[Run]] = {"subject": [], "floor_noop_effect": []}

        def in_turn_arm(_: int) -> Run:
            runs = alternate(n, {"subject": subject_call, "floor_noop_effect": noop_effect_call})
            for name, one in runs.items():
                in_turn[name].append(one)
            return runs["subject"]

        runs = interleave(
            reps,
            {
                "subject": arm(subject_call),
                "baseline": arm(baseline_call),
                "service": arm(service_call),
                "floor_two_fsync": arm(floor_two_fsync),
                "floor_effect": arm(floor_effect),
                "floor_noop_effect": arm(noop_effect_call),
                "healthz_noop": arm(lambda _: healthz(bare)),
                "healthz": arm(lambda _: healthz(direct)),
                "read_bare": arm(read_bare),
                "write_bare": arm(write_bare),
                "in_turn": in_turn_arm,
            },
        )
        runs["subject_in_turn"] = in_turn["subject"]
        runs["noop_effect_in_turn"] = in_turn["floor_noop_effect"]
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
                floor=write_file_floor(runs),
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
        for name, key, label in (
            ("floor_two_fsync", "floor_two_fsync", "no-op POST + 2 receipt-sized appends + fsyncs"),
            ("floor_with_effect", "floor_effect", "the same + the write's syscalls between them"),
            (
                "floor_noop_effect",
                "floor_noop_effect",
                "the subject's call to a tool server whose write_file writes nothing",
            ),
        ):
            result.figures.append(
                floor_figure(
                    f"pipeline.{name}",
                    "a floor of write_file on this machine vs the same baseline",
                    (label, "httpx POST to a no-op FastAPI endpoint + write + fsync"),
                    "calls/s",
                    (summarize(runs[key]), summarize(runs["baseline"])),
                    cost_ratio(runs[key], runs["baseline"]),
                    "floor time per call / baseline time per call (no goal: a floor)",
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
        result.notes.append(
            f"{receipts} receipt records were written by the arms that call a tool service "
            "(subject, no-op effect, bare write_file, in-process)."
        )
        result.notes.append(breakdown(runs))  # last: a table, which ends the list of notes
    return result
