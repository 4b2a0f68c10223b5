"""Single log lines for the detector's tests, and the detector run over whole files.

The whole-log generator is ``ops.testing.synthlog``; these build one line at a time
in the log schema of ``runner.core.events`` (``log_line``, ``result_line``,
``lease_line``), and ``run_detect`` reads files the way ``slotrunner ops detect``
does and returns what it found in a form the tests compare with the generator's.
"""

from __future__ import annotations

import json
from typing import Any

from ops.detect.detector import Incident, Replay, judge_records, read_records
from runner.core import events


def run_detect(
    paths: list[str],
) -> tuple[set[tuple[str, str, int]], set[tuple[str, int]], list[Incident]]:
    """(kind, path, line) of every incident, (path, line) of every malformed line, the incidents."""
    records, _ = read_records(paths)
    incidents: list[Incident] = []
    malformed: set[tuple[str, int]] = set()
    for item in judge_records(records, Replay()):
        if isinstance(item, Incident):
            incidents.append(item)
        else:
            malformed.add((item.path, item.line))
    return {(i.kind, i.path, i.line) for i in incidents}, malformed, incidents


def log_line(
    event: str, host: str = "h1", ts: str = "2025-01-01T00:00:00Z", **fields: Any
) -> bytes:
    return json.dumps({"event": event, **fields, "host": host, "ts": ts}).encode()


def result_line(
    job: str,
    gen: int,
    key: str,
    outcome: str = events.OUTCOME_APPLIED,
    tool: str = "apply_patch",
    host: str = "h1",
    slot: str = "S1",
    attempt: int = 1,
    **extra: Any,
) -> bytes:
    return log_line(
        events.TOOL_RESULT,
        host,
        job_id=job,
        attempt=attempt,
        slot_id=slot,
        slot_generation=gen,
        tool=tool,
        idempotency_key=key,
        outcome=outcome,
        http_status=200,
        queue_wait_ms=0.1,
        service_ms=1.0,
        **extra,
    )


def lease_line(
    job: str, gen: int, host: str = "h1", slot: str = "S1", released: bool = False, attempt: int = 1
) -> bytes:
    event = events.SLOT_RELEASED if released else events.SLOT_LEASED
    return log_line(event, host, slot_id=slot, generation=gen, job_id=job, attempt=attempt)
