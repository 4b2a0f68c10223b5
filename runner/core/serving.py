"""How every HTTP server of slotrunner runs under uvicorn: the tool server, the admission
gateway, and the benchmarks' no-op baselines, so a baseline is served as its subject.

uvloop's event loop and httptools' request parser instead of asyncio's loop and h11.
In an A/B of ``python -m bench.run --only pipeline,mcp,gateway`` (the same machine,
one run after the other, every server switched alike) a ``write_file`` through the tool
server fell from 3.97 to 3.48 ms at the median, the MCP figure from 1.56x to 1.44x of
the HTTP call and the gateway's p99 from 1.25x to 1.20x of a straight request; the
pipeline ratio stayed where it was (3.16x, 3.18x), its no-op baseline being served
faster too. Named here rather than left to uvicorn's ``auto``, so a missing package
fails the start instead of silently serving slower. No access log: the JSONL event
log has every call.
"""

from __future__ import annotations

from typing import Any

UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "log_level": "warning",
    "access_log": False,
}
