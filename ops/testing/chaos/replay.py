"""A buffered apply replayed on purpose: an old envelope with a fresh key.

After a job finished, one of its applied requests (as the fault proxy recorded it)
is POSTed straight to the tool server again, with the envelope it carried then and
a new idempotency key, once its slot was leased again: the generic retry layer of
docs/architecture.md §Problem, which replays bytes it does not understand. The fence
must refuse it (409 ``stale_generation`` / ``slot_job_mismatch`` / ``lease_expired``,
I1); with the fence switched off it lands in another job's lease, and the detector
and the verifier must both say so. On several hosts the replay goes to the tool
server of the host that applied the request (a slot is one host's), unless that host
is dead by then.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from ops.testing.chaos.stack import DEAD, ChaosHost, ChaosStack, wait_until
from runner.core.poll import PollTimeout, poll_until
from runner.core.stamp import StampError, read_stamp

REPLAY_WAIT_S = 30.0  # a replay waits this long for its slot to be leased again
CONNECT_WAIT_S = 30.0  # and this long for a tool server being restarted


@dataclass(frozen=True)
class Replayed:
    job_id: str
    attempt: int
    key: str
    slot_id: str
    generation: int  # of the old envelope
    slot_generation: int  # the slot's when the replay was sent
    status: int
    error: str | None
    host: str = ""  # whose tool server it went to

    def describe(self) -> str:
        return (
            f"old generation {self.generation} (slot at {self.slot_generation}) -> "
            f"{self.status} {self.error}"
        )


def replay_step(
    stack: ChaosStack, job_id: str, step: int, all_finished: threading.Event
) -> Replayed | str:
    """Replay ``job_id``'s applied request of ``step``; why not, when it cannot be."""
    applied = [
        (call, host)
        for host in stack.hosts
        for call, status in list(host.proxy.recorded)
        if status == 200 and call.envelope.get("job_id") == job_id and f":s{step}:" in call.key
    ]
    if not applied:
        return "the step never applied: nothing to replay"
    # One host: its last; several: the latest attempt's (the proxies' records are apart).
    call, host = max(applied, key=lambda a: int(a[0].envelope.get("attempt", 0)))
    if len(stack.hosts) == 1:
        call, host = applied[-1]
    envelope = dict(call.envelope)
    slot_id, generation = str(envelope["slot_id"]), int(envelope["generation"])
    # Wait for the slot to be recycled, so the replay aims at another job's lease (on
    # a host that was killed, once it is back and its janitor took the slot back).
    wait_until(
        lambda: (
            (host.state != DEAD and generation_of(host, slot_id) > generation)
            or all_finished.is_set()
        ),
        REPLAY_WAIT_S,
    )
    if host.state == DEAD:
        return f"its host {host.name} is dead: no tool server to replay to"
    envelope["idempotency_key"] = f"{envelope['idempotency_key']}:replay"
    body = {"envelope": envelope, "args": json.loads(call.body)["args"]}
    now = generation_of(host, slot_id)
    status, error = _post(host.toolserver_url, str(envelope["tool"]), body)
    attempt, key = int(envelope["attempt"]), str(envelope["idempotency_key"])
    name = host.name if len(stack.hosts) > 1 else ""
    return Replayed(job_id, attempt, key, slot_id, generation, now, status, error, name)


def generation_of(host: ChaosHost, slot_id: str) -> int:
    try:
        stamp = read_stamp(host.settings.slots_dir / slot_id)
    except StampError:
        return 0
    return stamp.generation if stamp is not None else 0


def _post(url: str, tool: str, body: dict[str, Any]) -> tuple[int, str | None]:
    """POST straight to the tool server, waiting out a restart (a connect error)."""

    def answered() -> httpx.Response | None:
        try:
            return httpx.post(f"{url}/v1/tools/{tool}", json=body, timeout=60.0)
        except httpx.ConnectError:
            return None

    try:
        reply = poll_until(answered, CONNECT_WAIT_S, 0.1)
    except PollTimeout:
        return 0, "connect_error"
    try:
        data = reply.json()
    except ValueError:
        data = {}
    error = data.get("error") if isinstance(data, dict) else None
    return reply.status_code, error
