"""One ``write_file`` through the MCP door against the same call over the HTTP API.

Subject: ``tools/call write_file`` with a fresh ``_meta`` idempotency key, sent by the
official ``mcp`` client (``ClientSession`` over streamable HTTP, one session kept open)
with the slot's lease token, to the real tool server process: bearer check, token
record, JSON-RPC framing, then the same dispatch as the HTTP API (envelope under the
slot lock, two receipt fsyncs, the write, one log line).

Baseline: ``POST /v1/tools/write_file`` with the same envelope and arguments, sent by
an ``httpx2.AsyncClient`` (the HTTP library the MCP client stands on) on the same event
loop, to the same server. Both arms apply every call.

Goal: the MCP call costs at most 1.3x the HTTP call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx2
from anyio.from_thread import start_blocking_portal
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import RequestParamsMeta

from bench.fixtures import Context, lease_slot, make_repo, settings_for, toolserver
from bench.stats import BenchResult, Figure, Goal, Run, cost_ratio, interleave, summarize, timed
from runner.slots.pool import Lease

GOAL = Goal("<=", 1.3, "<= 1.3x the same call over the HTTP API")
CONTENT = "x = 1  # written by the MCP benchmark\n"
KEY_META = "slotrunner/idempotency_key"


@asynccontextmanager
async def _clients(url: str, token: str) -> AsyncIterator[tuple[ClientSession, httpx2.AsyncClient]]:
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(base_url=url, timeout=30) as plain,
        httpx2.AsyncClient(headers=auth, timeout=30) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, plain


def run(ctx: Context) -> BenchResult:
    result = BenchResult("mcp")
    reps, n = ctx.pick(3, 7), ctx.pick(60, 300)
    work = ctx.dir("mcp")
    settings = settings_for(work / "home", ctx.redis_url, name="mcp")
    with contextlib.ExitStack() as stack:
        settings, server = toolserver(settings, work / "logs")
        stack.callback(server.stop)
        base = make_repo(work / "repo", {"pkg/lock.py": "held_by = None\n", "README": "x\n"})
        stamp, _ = lease_slot(settings, work / "repo", base, "bench-mcp")
        assert isinstance(stamp, Lease) and stamp.token
        portal = stack.enter_context(start_blocking_portal())
        session, plain = stack.enter_context(
            portal.wrap_async_context_manager(_clients(settings.toolserver_url, stamp.token))
        )
        calls = 0

        def args(i: int) -> dict[str, Any]:
            return {"path": f"bench/out_{i % 16}.py", "content": CONTENT}

        async def by_mcp(i: int, key: str) -> None:
            meta = cast(RequestParamsMeta, {KEY_META: key})
            reply = await session.call_tool("write_file", args(i), meta=meta)
            body = reply.structured_content or {}
            if reply.is_error or body.get("replayed") or body["receipt"]["status"] != "applied":
                raise RuntimeError(f"MCP write_file did not apply: {reply}")

        async def by_http(i: int, key: str) -> None:
            envelope = {
                "job_id": stamp.job_id,
                "attempt": stamp.attempt,
                "slot_id": stamp.slot_id,
                "generation": stamp.generation,
                "tool": "write_file",
                "idempotency_key": key,
            }
            reply = await plain.post(
                "/v1/tools/write_file", json={"envelope": envelope, "args": args(i)}
            )
            if reply.status_code != 200 or reply.json()["receipt"]["status"] != "applied":
                raise RuntimeError(f"HTTP write_file did not apply: {reply.text}")

        def subject_call(i: int) -> None:
            nonlocal calls
            calls += 1
            portal.call(by_mcp, i, f"bench-mcp:{calls}")

        def baseline_call(i: int) -> None:
            nonlocal calls
            calls += 1
            portal.call(by_http, i, f"bench-http:{calls}")

        # Warm both: connections, imports, the receipt and log files exist.
        timed(10, subject_call)
        timed(10, baseline_call)

        def subject(_: int) -> Run:
            return timed(n, subject_call)

        def baseline(_: int) -> Run:
            return timed(n, baseline_call)

        runs = interleave(reps, {"subject": subject, "baseline": baseline})
        ratio, low, high = cost_ratio(runs["subject"], runs["baseline"])
        result.figures.append(
            Figure(
                name="mcp.write_file",
                what="one write_file call, MCP tools/call vs POST /v1/tools/write_file",
                subject_label="mcp ClientSession.call_tool (streamable HTTP, lease token)",
                baseline_label="httpx2 POST /v1/tools/write_file (same server, same loop)",
                unit="calls/s",
                subject=summarize(runs["subject"]),
                baseline=summarize(runs["baseline"]),
                ratio=ratio,
                ratio_means="MCP time per call / HTTP API time per call",
                spread=(low, high),
                goal=GOAL,
            )
        )
        result.notes.append(
            f"{reps} repetitions of {n} calls per arm, interleaved; stateless JSON mode; "
            f"slot {stamp.slot_id} generation {stamp.generation}; {calls} calls in all."
        )
    return result
