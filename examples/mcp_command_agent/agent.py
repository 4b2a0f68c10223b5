"""Any MCP client as a slotrunner agent, run by the ``command`` planner kind.

The worker starts ``python3 -m mcp_command_agent.agent`` with the slot's MCP URL and
lease token in its environment (docs/architecture.md §Agents); everything below is
the official ``mcp`` client. Each call's idempotency key names the job, the attempt
and the step, so a resend applies once and a new attempt never collides with an old
one. Exit 0 succeeds the job; any other status fails it with the output's tail.
"""

import asyncio
import os

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

FIX = "def add(a, b):\n    return a + b\n"


async def main() -> int:
    auth = {"Authorization": f"Bearer {os.environ['SLOTRUNNER_TOKEN']}"}
    key = f"{os.environ['SLOTRUNNER_JOB_ID']}:a{os.environ['SLOTRUNNER_ATTEMPT']}"
    async with (
        httpx2.AsyncClient(headers=auth, timeout=httpx2.Timeout(60, read=600)) as http,
        streamable_http_client(os.environ["SLOTRUNNER_MCP_URL"], http_client=http) as (rd, wr),
        ClientSession(rd, wr) as session,
    ):
        await session.initialize()
        meta = {"slotrunner/idempotency_key": f"{key}:fix"}
        await session.call_tool("write_file", {"path": "calc.py", "content": FIX}, meta=meta)
        meta = {"slotrunner/idempotency_key": f"{key}:tests"}
        tests = await session.call_tool("run_tests", {}, meta=meta)
        print(tests.content[0].text)
        return 0 if not tests.is_error and tests.structured_content["result"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
