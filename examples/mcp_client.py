"""Give your agent a slot: lease one, then use its tools over MCP with the lease's token.

    python examples/mcp_client.py REPO [--job JOB_ID]

Needs this host's tool server running (``slotrunner toolserver``) and the same
``SLOTRUNNER_HOME``, ``REDIS_URL`` and ``SLOTRUNNER_TOOLSERVER_URL`` as it. The lease is
taken with ``slotrunner slots lease --json`` (which prints ``token`` and ``mcp_url``)
and returned with ``slotrunner slots release`` at the end; in between, any MCP client
can work in the slot's tree with nothing but the URL and the token. ``agent`` below is
the whole client: the official ``mcp`` package over streamable HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import uuid

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

SLOTRUNNER = [sys.executable, "-m", "runner.cli.main"]


async def agent(mcp_url: str, token: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=auth) as http,
        streamable_http_client(mcp_url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        print("tools:", ", ".join(tool.name for tool in (await session.list_tools()).tools))
        key = {"slotrunner/idempotency_key": "hello-1"}  # a resend with it applies once
        wrote = await session.call_tool("write_file", {"path": "HELLO", "content": "hi"}, meta=key)
        print("write_file:", wrote.structured_content)
        back = await session.call_tool("read_file", {"path": "HELLO"})
        print("read_file:", back.structured_content["result"]["content"])


def slotrunner(*args: str) -> str:
    return subprocess.run(
        [*SLOTRUNNER, *args], check=True, stdout=subprocess.PIPE, text=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", help="the repository the slot's tree starts from")
    parser.add_argument("--job", default=f"example-{uuid.uuid4().hex[:8]}", help="the job id")
    args = parser.parse_args()
    lease = json.loads(
        slotrunner("slots", "lease", "--job", args.job, "--repo", args.repo, "--json")
    )
    print(f"leased {lease['slot_id']} generation {lease['generation']} at {lease['mcp_url']}")
    try:
        asyncio.run(agent(lease["mcp_url"], lease["token"]))
    finally:
        slotrunner(
            "slots", "release", "--slot", lease["slot_id"], "--job", args.job,
            "--generation", str(lease["generation"]),
        )  # fmt: skip
        print(f"released {lease['slot_id']}: the token is dead")


if __name__ == "__main__":
    main()
