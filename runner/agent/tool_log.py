"""The calls an agent made on its own, read back from the host's log.

An agent that reaches the tools through the MCP door itself (a ``command`` agent,
``runner.agent.command``) makes calls the runner never sees. The tool server logs a
``tool_result`` line for each (docs/architecture.md §Log records) before it answers
it, in the host's one log file, so once the agent is gone every call it made is on
record. :class:`CallLog` notes where that file ends when the agent starts and, after
it ended, reads only what was appended since: the lines of the job's attempt are its
steps and counts, in the order the server answered them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.core import events
from runner.jobs.models import Counts, StepRecord

_STALE = frozenset({"stale_generation", "slot_job_mismatch", "lease_expired"})
# Lines longer than this are no tool_result of ours (a runaway record): skipped unread.
_MAX_LINE = 1024 * 1024


class CallLog:
    """The host log from this point on, for one attempt's calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def calls(self, job_id: str, attempt: int) -> tuple[list[StepRecord], Counts]:
        """The attempt's ``tool_result`` lines appended since this object was made."""
        records: list[StepRecord] = []
        counts = Counts()
        for line in self._lines():
            if line.get("event") != events.TOOL_RESULT:
                continue
            if line.get("job_id") != job_id or line.get("attempt") != attempt:
                continue
            record = _record(len(records), line)
            records.append(record)
            counts.tool_calls += 1
            if record.outcome == "replayed":
                counts.replayed += 1
            if record.idempotency_key and record.outcome in ("applied", "replayed", "failed"):
                counts.receipts += 1
            if line.get("reason") in _STALE:
                counts.stale_rejects += 1
        return records, counts

    def _lines(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as log:
                size = log.seek(0, 2)
                # A log rotated meanwhile is shorter than the mark: all of it is new.
                log.seek(self.offset if size >= self.offset else 0)
                raw = log.read()
        except OSError:
            return []
        out = []
        for text in raw.splitlines():
            if len(text) > _MAX_LINE or b'"tool_result"' not in text:
                continue
            try:
                line = json.loads(text)
            except ValueError:
                continue  # a line another process is writing right now
            if isinstance(line, dict):
                out.append(line)
        return out


def _record(index: int, line: dict[str, Any]) -> StepRecord:
    outcome = str(line.get("outcome", "unknown"))
    reason = line.get("reason")
    return StepRecord(
        index=index,
        tool=str(line.get("tool", "?"))[:64],
        idempotency_key=line.get("idempotency_key"),
        outcome=outcome if outcome in ("applied", "replayed", "read", "refused") else "failed",
        detail=str(reason) if reason else None,
    )
