"""Incidents and garbage lines written into a synthetic log, each remembered where it went.

Every variant in :data:`INJECTIONS` is one line that the detector must report as the
kinds it names (``ops.detect.detector.Kind``); every variant in :data:`GARBAGE` is a
line it must report as malformed. :func:`inject` returns False when no slot of the log
is in a state for that variant yet (the caller writes more traffic and tries again).
"""

from __future__ import annotations

import json

from ops.detect.detector import Kind
from ops.testing.synthlog.traffic import LogSynth
from runner.core import events

INJECTIONS: dict[str, tuple[str, ...]] = {
    # variant -> the kinds the detector must report on that one line
    "cross_job_owner": (Kind.CROSS_JOB,),
    "cross_job_receipt": (Kind.CROSS_JOB,),
    "stale": (Kind.STALE,),
    "duplicate": (Kind.DUPLICATE,),
    "unowned_slot": (Kind.UNOWNED,),
    "unowned_generation": (Kind.UNOWNED,),
    "seed_replay": (Kind.STALE, Kind.DUPLICATE),  # a buffered replay: old envelope, same key
}
GARBAGE = ("truncated_apply", "truncated_lease", "binary", "non_object", "missing_field")


def inject(synth: LogSynth, variant: str, tool: str) -> bool:
    """Write one incident line of ``variant``; False when no slot is in a state for it."""
    rng = synth.rng
    live = [(w, s) for w, s in synth.slots.items() if s.job is not None]
    if variant in ("cross_job_owner", "cross_job_receipt", "duplicate", "unowned_generation"):
        live = [(w, s) for w, s in live if s.keys or variant != "duplicate"]
        if not live:
            return False
        (host, slot_id), s = rng.choice(live)
        assert s.job is not None
        if variant == "cross_job_owner":
            intruder = f"intruder-{synth.seq}"
            where = synth.result(
                host,
                slot_id,
                s.generation,
                intruder,
                tool,
                events.OUTCOME_APPLIED,
                synth.fresh_key(intruder),
                receipt_job=intruder,
            )
        elif variant == "cross_job_receipt":
            where = synth.result(
                host,
                slot_id,
                s.generation,
                s.job,
                tool,
                events.OUTCOME_APPLIED,
                synth.fresh_key(s.job),
                s.attempt,
                receipt_job=f"victim-{synth.seq}",
            )
        elif variant == "duplicate":
            where = synth.result(
                host,
                slot_id,
                s.generation,
                s.job,
                tool,
                events.OUTCOME_APPLIED,
                rng.choice(s.keys),
                s.attempt,
                receipt_job=s.job,
            )
        else:
            where = synth.result(
                host,
                slot_id,
                s.generation + 5,
                s.job,
                tool,
                events.OUTCOME_APPLIED,
                synth.fresh_key(s.job),
                s.attempt,
            )
    elif variant in ("stale", "seed_replay"):
        # A live slot whose previous job (generation - 1) replays into it.
        old = [
            (w, s)
            for w, s in live
            if s.prev_job is not None and (s.prev_keys or variant == "stale")
        ]
        if not old:
            return False
        (host, slot_id), s = rng.choice(old)
        assert s.prev_job is not None
        key = rng.choice(s.prev_keys) if variant == "seed_replay" else synth.fresh_key(s.prev_job)
        where = synth.result(
            host,
            slot_id,
            s.generation - 1,
            s.prev_job,
            tool,
            events.OUTCOME_APPLIED,
            key,
            receipt_job=s.prev_job,
        )
    else:  # unowned_slot: a slot never leased on this host
        host = rng.choice(list(synth.out))
        where = synth.result(
            host,
            f"S-ghost-{synth.seq}",
            1,
            f"ghost-{synth.seq}",
            tool,
            events.OUTCOME_APPLIED,
            synth.fresh_key("ghost"),
        )
    for kind in INJECTIONS[variant]:
        synth.expected.add((str(kind), *where))
    return True


def write_garbage(synth: LogSynth, variant: str) -> None:
    host = synth.rng.choice(list(synth.out))
    if variant == "truncated_apply":
        line = json.dumps(
            {
                "event": events.TOOL_RESULT,
                "job_id": "torn",
                "attempt": 1,
                "slot_id": "S0",
                "slot_generation": 1,
                "tool": "apply_patch",
                "idempotency_key": "torn:1",
                "outcome": "applied",
                "receipt_job": "someone-else",
                "host": host,
                "ts": synth.next_ts(),
            }
        )
        data = line[: len(line) * 2 // 3].encode()
    elif variant == "truncated_lease":
        line = json.dumps(
            {
                "event": events.SLOT_LEASED,
                "slot_id": "S1",
                "generation": 99,
                "job_id": "torn",
                "attempt": 1,
                "host": host,
                "ts": synth.next_ts(),
            }
        )
        data = line[: len(line) // 2].encode()
    elif variant == "binary":
        data = bytes(synth.rng.choice(range(0x80, 0x100)) for _ in range(200))
    elif variant == "non_object":
        data = b'["tool_result", "applied", 1]'
    else:  # missing_field: a lease with no generation
        data = json.dumps(
            {
                "event": events.SLOT_LEASED,
                "slot_id": "S2",
                "job_id": "half",
                "attempt": 1,
                "host": host,
                "ts": synth.next_ts(),
            }
        ).encode()
    synth.malformed.add(synth.raw(host, data))
