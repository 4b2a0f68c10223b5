"""A new lease rotates the slot's settled receipts out of the hot file
(runner/slots/rotation.py), and the real tool server, running all along and then
restarted, still answers every rotated key and keeps it bound to its job (#17)."""

from __future__ import annotations

import json

import httpx

from runner.core import events
from tests.support.execslots import Slots, envelope
from tests.support.toolserver import ToolServer
from tools.receipts.store import RECEIPTS_FILE


def write(url: str, body_envelope: dict[str, object], path: str) -> httpx.Response:
    body = {"envelope": body_envelope, "args": {"path": path, "content": "x\n"}}
    return httpx.post(f"{url}/v1/tools/write_file", json=body, timeout=30)


def events_named(toolserver: ToolServer, name: str) -> list[dict[str, object]]:
    lines = toolserver.settings.log_path.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == name]


def test_a_lease_rotates_and_the_server_still_answers_the_old_keys(
    toolserver: ToolServer, slots: Slots
) -> None:
    url = toolserver.url
    first = slots.lease("job-A")
    key = "job-A:a1:s0:write_file"
    assert write(url, envelope(first, key, "write_file"), "a.txt").status_code == 200
    slots.release(first)
    second = slots.lease("job-B")
    assert (second.slot_id, second.generation) == (first.slot_id, first.generation + 1)
    hot = slots.dir(second) / RECEIPTS_FILE
    assert hot.read_bytes() == b""
    rotated = events_named(toolserver, events.RECEIPTS_ROTATED)
    assert [(e["slot_id"], e["generation"], e["keys"]) for e in rotated] == [
        (second.slot_id, second.generation, 1)
    ]

    for restarted in (False, True):
        if restarted:
            toolserver.stop()
            toolserver.start()
        found = httpx.get(f"{url}/v1/receipts/{key}", params={"slot": "S0"}, timeout=30)
        assert found.status_code == 200, found.text
        assert found.json()["receipt"]["job_id"] == "job-A"
        stolen = write(url, envelope(second, key, "write_file"), "b.txt")
        assert stolen.status_code == 409 and stolen.json()["error"] == "key_bound_to_other_job"
        assert not (slots.work(second) / "b.txt").exists()
    own = write(url, envelope(second, "job-B:a1:s0:write_file", "write_file"), "c.txt")
    assert own.status_code == 200
    assert b"job-B:a1:s0" in hot.read_bytes() and key.encode() not in hot.read_bytes()
