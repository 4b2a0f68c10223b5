"""The JSONL event log every process of a host appends to.

One JSON object per line, UTC ISO timestamps, written with one ``write`` on an
``O_APPEND`` file descriptor so lines from concurrent processes never interleave.
The writer is structlog: a plain processor chain ending in a JSON renderer.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import IO, Any

import structlog
from structlog.typing import EventDict, WrappedLogger

from runner.core.settings import Settings


def _encode(_: WrappedLogger, __: str, rendered: Any) -> bytes:
    # The JSON renderer before this one hands over a str, not an event dict.
    return str(rendered).encode("utf-8")


class _AppendLogger:
    """A structlog logger that appends each rendered line in one write.

    The file is unbuffered (``buffering=0``), so ``write`` is one ``os.write`` on an
    ``O_APPEND`` descriptor: atomic with respect to other appenders of the file.
    """

    def __init__(self, path: Path, echo: IO[str] | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the logger
        self._echo = echo
        self._lock = threading.Lock()

    def msg(self, message: bytes) -> None:
        line = message + b"\n"
        with self._lock:
            self._file.write(line)
            if self._echo is not None:
                self._echo.write(line.decode("utf-8"))
                self._echo.flush()

    info = warning = error = debug = critical = msg

    def close(self) -> None:
        self._file.close()


_SINKS: dict[tuple[int, Path, bool], _AppendLogger] = {}


def _sink_for(path: Path, echo: bool) -> _AppendLogger:
    """One append descriptor per process and file, open for the life of the process."""
    import os

    key = (os.getpid(), path, echo)
    sink = _SINKS.get(key)
    if sink is None:
        sink = _SINKS[key] = _AppendLogger(path, sys.stdout if echo else None)
    return sink


class EventLog:
    """A host's event log: ``log.emit("tool_result", job_id=..., ...)``."""

    def __init__(self, settings: Settings, echo: bool = False) -> None:
        self.path = settings.log_path
        self._sink = _sink_for(self.path, echo)
        host = settings.host

        def add_host(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
            event_dict.setdefault("host", host)
            return event_dict

        # bind() once: wrap_logger returns a lazy proxy that would build a new bound
        # logger on every emit, and a line is emitted before every tool reply.
        self._log: Any = structlog.wrap_logger(
            self._sink,
            processors=[
                add_host,
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                structlog.processors.JSONRenderer(sort_keys=False),
                _encode,
            ],
        ).bind()

    def emit(self, event: str, **fields: Any) -> None:
        self._log.info(event, **fields)
