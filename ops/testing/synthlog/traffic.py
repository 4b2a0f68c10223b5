"""Normal traffic of a synthetic event log: leases, releases and tool results, no incident.

The records follow the log schema of ``runner.core.events``; which tools mutate comes
from ``tools.registry``, so a tool added there shows up in the generated traffic.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

from runner.core import events
from tools.registry import MUTATING_TOOLS, TOOLS

MUTATING = sorted(MUTATING_TOOLS)
READ_ONLY = sorted(set(TOOLS) - MUTATING_TOOLS)
T0 = datetime(2025, 3, 1, tzinfo=UTC)


@dataclass
class _Slot:
    generation: int = 0
    job: str | None = None
    attempt: int = 1
    calls_left: int = 0
    keys: list[str] = field(default_factory=list)
    prev_job: str | None = None  # the job of generation - 1
    prev_keys: list[str] = field(default_factory=list)


class LogSynth:
    """Writes a plausible multi-host event log and remembers exactly what it injected.

    ``out`` is one stream for every host, or one stream per host (then each host's
    lines go to its own file and ``paths`` names them). Normal traffic (reads,
    applies, replays, refused stale replays, foreign-receipt refusals, failures)
    holds no incident; ``incidents.inject`` adds them, recorded in ``expected`` as
    ``(kind, path, line)``; ``incidents.write_garbage`` adds garbage lines, recorded in
    ``malformed`` as ``(path, line)``.
    """

    def __init__(
        self, out: dict[str, BinaryIO], paths: dict[str, str], slots: int = 4, seed: int = 0
    ) -> None:
        self.out, self.paths = out, paths
        self.rng = random.Random(seed)
        self.slots = {(h, f"S{i}"): _Slot() for h in out for i in range(slots)}
        self.lines: Counter[str] = Counter()
        self.expected: set[tuple[str, str, int]] = set()
        self.malformed: set[tuple[str, int]] = set()
        self.meta: dict[tuple[str, int], dict[str, object]] = {}  # kept when keep_meta
        self.keep_meta = False
        self._tick = 0
        self.seq = 0

    # -- writing --
    def next_ts(self) -> str:
        self._tick += 1
        return (T0 + timedelta(milliseconds=self._tick)).isoformat().replace("+00:00", "Z")

    def raw(self, host: str, data: bytes) -> tuple[str, int]:
        path = self.paths[host]
        self.out[host].write(data + b"\n")
        self.lines[path] += 1
        return path, self.lines[path]

    def emit(self, host: str, event: str, **fields: object) -> tuple[str, int]:
        record = {"event": event, **fields, "host": host, "ts": self.next_ts()}
        where = self.raw(host, json.dumps(record).encode())
        if self.keep_meta:
            self.meta[where] = record
        return where

    def fresh_key(self, job: str) -> str:
        self.seq += 1
        return f"{job}:k{self.seq}"

    def result(
        self,
        host: str,
        slot_id: str,
        gen: int,
        job: str,
        tool: str,
        outcome: str,
        key: str,
        attempt: int = 1,
        **extra: object,
    ) -> tuple[str, int]:
        return self.emit(
            host,
            events.TOOL_RESULT,
            job_id=job,
            attempt=attempt,
            slot_id=slot_id,
            slot_generation=gen,
            tool=tool,
            idempotency_key=key,
            outcome=outcome,
            http_status=extra.pop("http_status", 200),
            queue_wait_ms=0.4,
            service_ms=3.1,
            **extra,
        )

    # -- normal traffic --
    def step(self) -> None:
        host, slot_id = self.rng.choice(list(self.slots))
        s = self.slots[(host, slot_id)]
        rng = self.rng
        if s.job is None:
            self.seq += 1
            s.generation += 1
            s.job, s.attempt, s.keys = f"job-{self.seq}", rng.choice((1, 1, 2)), []
            s.calls_left = rng.randint(2, 14)
            self.emit(
                host,
                events.SLOT_LEASED,
                slot_id=slot_id,
                generation=s.generation,
                job_id=s.job,
                attempt=s.attempt,
            )
            return
        job, gen, att = s.job, s.generation, s.attempt
        if s.calls_left == 0:
            self.emit(
                host, events.SLOT_RELEASED, slot_id=slot_id, generation=gen, job_id=job, attempt=att
            )
            s.prev_job, s.prev_keys, s.job = job, s.keys, None
            return
        s.calls_left -= 1
        roll = rng.random()
        if roll < 0.40:
            self.result(
                host,
                slot_id,
                gen,
                job,
                rng.choice(READ_ONLY),
                events.OUTCOME_READ,
                f"{job}:r{self.seq}",
                att,
            )
        elif roll < 0.75 or not s.keys:
            key = self.fresh_key(job)
            s.keys.append(key)
            self.result(
                host,
                slot_id,
                gen,
                job,
                rng.choice(MUTATING),
                events.OUTCOME_APPLIED,
                key,
                att,
                receipt_job=job,
                receipt_generation=gen,
            )
        elif roll < 0.83:
            self.result(
                host,
                slot_id,
                gen,
                job,
                rng.choice(MUTATING),
                events.OUTCOME_REPLAYED,
                rng.choice(s.keys),
                att,
                receipt_job=job,
                receipt_generation=gen,
            )
        elif roll < 0.90 and s.prev_job is not None:
            # The server refusing a buffered replay: an old envelope, nothing applied.
            self.result(
                host,
                slot_id,
                gen - 1,
                s.prev_job,
                "apply_patch",
                events.OUTCOME_REFUSED,
                rng.choice(s.prev_keys or ["k-none"]),
                reason="stale_generation",
                http_status=409,
            )
        elif roll < 0.93 and s.prev_job is not None:
            self.result(
                host,
                slot_id,
                gen,
                job,
                "apply_patch",
                events.OUTCOME_REFUSED,
                self.fresh_key(job),
                att,
                reason="key_bound_to_other_job",
                http_status=409,
                receipt_job=s.prev_job,
                receipt_generation=gen - 1,
            )
        else:
            self.result(
                host,
                slot_id,
                gen,
                job,
                rng.choice(MUTATING),
                events.OUTCOME_FAILED,
                self.fresh_key(job),
                att,
                reason="tool_failed",
                receipt_job=job,
                receipt_generation=gen,
            )
