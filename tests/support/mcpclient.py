"""The official MCP client (``ClientSession`` over streamable HTTP), driven from sync tests.

The session runs in a blocking portal's event loop (its own thread), so a test calls
``tools/list`` and ``tools/call`` like plain functions and keeps one session open for
many calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import httpx2
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, RequestParamsMeta, Tool

KEY_META = "slotrunner/idempotency_key"


@asynccontextmanager
async def _session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


class Mcp:
    """One open client session; each method is one MCP request."""

    def __init__(self, portal: BlockingPortal, session: ClientSession) -> None:
        self.portal = portal
        self.session = session

    def tools(self) -> list[Tool]:
        return self.portal.call(self.session.list_tools).tools

    def call(self, tool: str, args: dict[str, Any], key: str | None = None) -> CallToolResult:
        # RequestParamsMeta is an open TypedDict (PEP 728), which mypy cannot build yet.
        meta = cast(RequestParamsMeta, {KEY_META: key}) if key is not None else None

        async def send() -> CallToolResult:
            return await self.session.call_tool(tool, args, meta=meta)

        return self.portal.call(send)


@contextmanager
def mcp_session(url: str, token: str | None) -> Iterator[Mcp]:
    """An initialized session at ``url`` with ``token`` as its bearer (None: no header)."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_session(url, token)) as session,
    ):
        yield Mcp(portal, session)


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert block.type == "text"
    return block.text
