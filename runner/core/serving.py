"""How every HTTP server of slotrunner runs under uvicorn: the tool server, the admission
gateway, and the benchmarks' no-op baselines, so a baseline is served as its subject.

uvloop's event loop and httptools' request parser instead of asyncio's loop and h11:
a ``write_file`` through the tool server fell from 3.9 to 2.4 ms at the median on the
benchmark's machine (``bench/RESULTS.md``, pipeline), most of it the event loop's and
the parser's Python work on every request, and the thread hop's wake-up. Named here
rather than left to uvicorn's ``auto``, so a missing package fails the start instead
of silently serving slower. No access log: the JSONL event log has every call.
"""

from __future__ import annotations

from typing import Any

UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "log_level": "warning",
    "access_log": False,
}
