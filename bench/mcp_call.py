"""One ``write_file`` through the MCP door against the same call over the HTTP API.

Subject: ``tools/call write_file`` with a fresh ``_meta`` idempotency key, sent by the
official ``mcp`` client (``ClientSession`` over streamable HTTP, one session kept open)
with the slot's lease token, to the real tool server process: bearer check, token
record, JSON-RPC framing, then the same dispatch as the HTTP API (envelope under the
slot lock, two receipt fsyncs, the write, one log line).

Baseline: ``POST /v1/tools/write_file`` with the same envelope and arguments, sent by
an ``httpx2.AsyncClient`` (the HTTP library the MCP client stands on) on the same event
loop, to the same server. Both arms apply every call.

Floor: what the ``mcp`` package itself adds to a call, measured on servers that do
nothing: ``call_tool`` by the same official client to a no-op MCP server (the same
package in the same stateless JSON mode, ``bench.noop_mcp``), against an httpx2 POST to
the no-op HTTP server (``bench.noop_server``). The floor is the HTTP call plus that
difference, repetition by repetition: the least an MCP call of this work can cost here
with this package, whatever the tool server's door does.

The four arms are called in turn, one call of each at a time
(``bench.stats.alternate_reps``): the floor is built from three arms, and a block of
one of them could meet a slow second of the host that the others' blocks never see.

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

from bench.fixtures import Context, lease_slot, make_repo, noop_server, settings_for, toolserver
from bench.stats import (
    BenchResult,
    Figure,
    Floor,
    Goal,
    Run,
    alternate_reps,
    cost_ratio,
    floor_figure,
    summarize,
    timed,
)
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


def _floor(runs: dict[str, list[Run]]) -> tuple[Floor, list[Run]]:
    """The MCP floor: each repetition's HTTP call plus what the package adds doing nothing."""
    floor_runs = []
    for base, mcp_, http in zip(runs["baseline"], runs["noop_mcp"], runs["noop_http"], strict=True):
        extra = max(0.0, mcp_.cost_s - http.cost_s)  # what the package adds to one call
        floor_runs.append(
            Run(tuple(t + extra for t in base.op_s), base.wall_s + extra * base.ops, base.ops)
        )
    value = cost_ratio(floor_runs, runs["baseline"])[0]
    ratio, low, high = cost_ratio(runs["subject"], floor_runs)
    floor = Floor(
        name="mcp.floor_package",
        what="the HTTP call + (mcp client -> no-op MCP server) - (httpx2 -> no-op HTTP server)",
        value=value,
        ratio=ratio,
        ratio_means="subject time per call / floor time per call",
        spread=(low, high),
    )
    return floor, floor_runs


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
        noop_http_url, noop_http = noop_server(work / "logs")
        stack.callback(noop_http.stop)
        noop_mcp_url, noop_mcp = noop_server(work / "logs", "bench.noop_mcp")
        stack.callback(noop_mcp.stop)
        portal = stack.enter_context(start_blocking_portal())
        session, plain = stack.enter_context(
            portal.wrap_async_context_manager(_clients(settings.toolserver_url, stamp.token))
        )
        noop_session, _ = stack.enter_context(
            portal.wrap_async_context_manager(_clients(noop_mcp_url, "unused"))
        )
        noop_post = stack.enter_context(
            portal.wrap_async_context_manager(
                httpx2.AsyncClient(base_url=noop_http_url, timeout=30)
            )
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

        async def noop_by_mcp(i: int, key: str) -> None:
            meta = cast(RequestParamsMeta, {KEY_META: key})
            reply = await noop_session.call_tool("write_file", args(i), meta=meta)
            if reply.is_error:
                raise RuntimeError(f"the no-op MCP server refused: {reply}")

        async def noop_by_http(i: int, key: str) -> None:
            body = {"envelope": {"idempotency_key": key, "tool": "write_file"}, "args": args(i)}
            reply = await noop_post.post("/v1/tools/write_file", json=body)
            reply.raise_for_status()

        def subject_call(i: int) -> None:
            nonlocal calls
            calls += 1
            portal.call(by_mcp, i, f"bench-mcp:{calls}")

        def baseline_call(i: int) -> None:
            nonlocal calls
            calls += 1
            portal.call(by_http, i, f"bench-http:{calls}")

        def noop_mcp_call(i: int) -> None:
            portal.call(noop_by_mcp, i, f"noop-mcp:{i}")

        def noop_http_call(i: int) -> None:
            portal.call(noop_by_http, i, f"noop-http:{i}")

        # Warm all: connections, imports, the receipt and log files exist.
        for call in (subject_call, baseline_call, noop_mcp_call, noop_http_call):
            timed(10, call)

        runs = alternate_reps(
            reps,
            n,
            {
                "subject": subject_call,
                "baseline": baseline_call,
                "noop_mcp": noop_mcp_call,
                "noop_http": noop_http_call,
            },
        )
        floor, floor_runs = _floor(runs)
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
                floor=floor,
            )
        )
        result.figures.append(
            floor_figure(
                "mcp.floor_package",
                "the HTTP call + what the mcp package adds to a call doing nothing",
                ("the floor (see its definition)", "httpx2 POST /v1/tools/write_file"),
                "calls/s",
                (summarize(floor_runs), summarize(runs["baseline"])),
                cost_ratio(floor_runs, runs["baseline"]),
                "floor time per call / HTTP API time per call",
                note=(
                    f"no-op MCP call p50 {summarize(runs['noop_mcp'])['p50_ms']:.3f} ms, "
                    f"no-op HTTP POST p50 {summarize(runs['noop_http'])['p50_ms']:.3f} ms"
                ),
            )
        )
        result.notes.append(
            f"{reps} repetitions of {n} calls per arm, the arms called in turn (one call of "
            f"each at a time); stateless JSON mode; "
            f"slot {stamp.slot_id} generation {stamp.generation}; {calls} calls in all."
        )
    return result
