"""The tool server dies between an exec's intent and its outcome: after the restart the
key is outcome_unknown for good, and the command never runs a second time (a counter
file the command appends to proves it). docs/architecture.md §Exec tool."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner.core.poll import poll_until
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from tests.support.execslots import Slots, envelope, procs_with, run
from tests.support.toolserver import ToolServer
from tools.client import ToolClient, ToolRefused
from tools.envelope import Envelope
from tools.reasons import Reason


@pytest.fixture
def server(settings: Settings, tmp_path: Path) -> Iterator[ToolServer]:
    found = ToolServer(settings, tmp_path / "logs", faults=True)
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture
def toolserver(server: ToolServer) -> ToolServer:
    """The root conftest's ``slots`` lease on this module's server, the one with faults."""
    return server


def statuses(slot_dir: Path, key: str) -> list[str]:
    lines = (slot_dir / "receipts.jsonl").read_text().splitlines()
    return [json.loads(line)["status"] for line in lines if json.loads(line)["key"] == key]


def assert_never_again(server: ToolServer, slots: Slots, stamp: Stamp, key: str) -> None:
    """After the restart: a resend, a lookup and the client all say outcome_unknown."""
    count = slots.work(stamp) / "count.txt"
    ran = count.read_text()
    resend = run(server.url, stamp, key, {"command": "echo again >> count.txt"})
    assert resend.status_code == 409 and resend.json()["error"] == "outcome_unknown", resend.text
    assert resend.json()["receipt"]["status"] == "intent"
    lookup = httpx.get(f"{server.url}/v1/receipts/{key}", params={"slot": stamp.slot_id})
    assert lookup.status_code == 409 and lookup.json()["status"] == "unknown"
    client = ToolClient(server.url, timeout_s=30)
    with pytest.raises(ToolRefused) as caught:
        client.call(
            Envelope.model_validate(envelope(stamp, key)),
            {"command": "echo again >> count.txt"},
            slot_dir=slots.dir(stamp),
        )
    client.close()
    assert caught.value.reason is Reason.OUTCOME_UNKNOWN
    assert count.read_text() == ran  # never ran again
    assert statuses(slots.dir(stamp), key) == ["intent"]
    recovered = [
        json.loads(line)
        for line in server.settings.log_path.read_text().splitlines()
        if '"receipt_resolved"' in line
    ]
    assert [(r["key"], r["resolution"]) for r in recovered] == [(key, "outcome_unknown")]


def test_crash_after_the_command_is_outcome_unknown_and_never_rerun(
    server: ToolServer, slots: Slots
) -> None:
    """The fault plan SIGKILLs the server after the command ran, before its outcome."""
    assert server.faults is not None and server.child is not None
    stamp = slots.lease("job-A")
    key = "job-A:a1:s0:exec"
    server.faults.arm_crash(key_contains=key, tool="exec")
    with pytest.raises(httpx.TransportError):
        run(server.url, stamp, key, {"command": "echo ran >> count.txt"})
    assert server.child.proc.wait(timeout=30) == -9
    assert statuses(slots.dir(stamp), key) == ["intent"]
    assert (slots.work(stamp) / "count.txt").read_text() == "ran\n"
    server.stop()
    server.start()
    assert_never_again(server, slots, stamp, key)


def test_server_killed_mid_command_takes_the_command_with_it(
    server: ToolServer, slots: Slots
) -> None:
    """SIGKILL to the server while the command runs: the sandbox dies with it (no process
    of the command is left to write later), and the key stays unknown."""
    assert server.child is not None
    stamp = slots.lease("job-A")
    key = "job-A:a1:s1:exec"
    d = f"30.{uuid.uuid4().int % 10**8:08d}"  # marks the command's processes in /proc
    command = f"echo ran >> count.txt; (sleep {d}; echo bg >> count.txt) & sleep {d}"
    count = slots.work(stamp) / "count.txt"
    failed: list[BaseException] = []

    def post() -> None:
        try:
            run(server.url, stamp, key, {"command": command})
        except httpx.TransportError as exc:  # the server dies under the call
            failed.append(exc)

    thread = threading.Thread(target=post)
    thread.start()
    poll_until(count.exists, 30, 0.02)  # the command is running
    assert procs_with(d)
    server.child.proc.kill()
    thread.join(timeout=30)
    assert failed, "the call was answered although its server was killed"
    poll_until(lambda: not procs_with(d), 10, 0.05)  # bwrap --die-with-parent
    assert statuses(slots.dir(stamp), key) == ["intent"]
    server.stop()
    server.start()
    assert count.read_text() == "ran\n"
    assert_never_again(server, slots, stamp, key)
