"""The exec tool's contract on a real tool server and the real bwrap: its result, its
arguments, its receipt and replay, a lost reply settled without a resend, and the
sandbox policy (docs/architecture.md §Exec tool)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ops.testing.fault_proxy import FaultProxy, Rule
from runner.core.settings import Settings
from tests.support.execslots import Slots, envelope, run
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools import registry
from tools.builtin import write_job
from tools.client import OutcomeUnknown, ToolClient
from tools.envelope import Envelope
from tools.server.service import ToolService

RESULT_FIELDS = {"exit_code", "output", "truncated", "timed_out", "duration_ms", "sandbox"}


def receipt_lines(slot_dir: Path, key: str) -> list[dict[str, Any]]:
    path = slot_dir / "receipts.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["key"] == key]


def exec_log(settings: Settings) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in settings.log_path.read_text().splitlines()]
    return [line for line in lines if line.get("tool") == "exec"]


def test_exec_runs_in_the_tree_merges_output_and_replays_from_its_receipt(
    toolserver: ToolServer, slots: Slots
) -> None:
    """bash -c in the work tree, stdout and stderr in order, the exit code kept; the
    same key again answers from the receipt and the command does not run again."""
    stamp = slots.lease("job-A")
    command = "echo one; echo two >&2; echo three; printf x > made.txt; echo ran >> count.txt"
    first = run(toolserver.url, stamp, "job-A:e1", {"command": command + "; exit 3"})
    assert first.status_code == 200, first.text
    result = first.json()["result"]
    assert set(result) == RESULT_FIELDS
    assert (result["exit_code"], result["output"]) == (3, "one\ntwo\nthree\n")
    assert (result["truncated"], result["timed_out"], result["sandbox"]) == (False, False, "bwrap")
    receipt = first.json()["receipt"]
    assert receipt["status"] == "applied" and receipt["result"] == result
    assert (slots.work(stamp) / "made.txt").read_text() == "x"
    again = run(toolserver.url, stamp, "job-A:e1", {"command": command})
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert again.json()["result"] == result
    assert (slots.work(stamp) / "count.txt").read_text() == "ran\n"  # it ran once
    assert [r["status"] for r in receipt_lines(slots.dir(stamp), "job-A:e1")] == [
        "intent",
        "applied",
    ]
    lines = exec_log(toolserver.settings)
    assert [(e["outcome"], e.get("sandbox")) for e in lines] == [
        ("applied", "bwrap"),
        ("replayed", None),
    ]


def test_long_output_keeps_its_head_and_tail_and_the_receipt_holds_it(
    toolserver: ToolServer, slots: Slots
) -> None:
    """Past the cap the middle is dropped with a marker; the receipt keeps the same text,
    so a replay answers exactly what the first call did."""
    stamp = slots.lease("job-A")
    command = "echo BEGIN; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END"
    response = run(toolserver.url, stamp, "job-A:long", {"command": command})
    result = response.json()["result"]
    assert result["truncated"] is True and result["exit_code"] == 0
    output = result["output"]
    assert output.startswith("BEGIN\nxxx") and output.endswith("xxx\nEND\n")
    assert "bytes of output omitted ...]" in output
    assert len(output.encode()) <= registry.EXEC_OUTPUT_BYTES + 100
    assert response.json()["receipt"]["result"]["output"] == output


BAD_ARGS: list[tuple[dict[str, Any], str]] = [
    ({}, "command"),
    ({"command": ""}, "command"),
    ({"command": "   \n"}, "command"),
    ({"command": "echo a\x00b"}, "command"),
    ({"command": ["ls"]}, "command"),
    ({"command": 7}, "command"),
    ({"command": "x" * (registry.MAX_COMMAND_CHARS + 1)}, "command"),
    ({"command": "true", "timeout_s": 0}, "timeout_s"),
    ({"command": "true", "timeout_s": -1}, "timeout_s"),
    ({"command": "true", "timeout_s": registry.MAX_EXEC_TIMEOUT_S + 1}, "timeout_s"),
    ({"command": "true", "timeout_s": "5"}, "timeout_s"),
    ({"command": "true", "timeout_s": True}, "timeout_s"),
    ({"command": "true", "timeout_s": None}, "timeout_s"),
    ({"command": "true", "cwd": "/"}, "cwd"),
]


def test_bad_arguments_are_refused_naming_the_field(toolserver: ToolServer, slots: Slots) -> None:
    """Each malformed argument is a 422 that names its field; nothing is recorded or run."""
    stamp = slots.lease("job-A")
    for n, (args, field) in enumerate(BAD_ARGS):
        key = f"job-A:bad{n}"
        response = run(toolserver.url, stamp, key, args)
        assert response.status_code == 422, (args, response.text)
        body = response.json()
        assert body["error"] == "malformed" and f"exec: {field}" in body["message"], body
        assert receipt_lines(slots.dir(stamp), key) == []


def test_a_lost_reply_is_settled_from_the_receipt_and_never_resent(
    toolserver: ToolServer, slots: Slots
) -> None:
    """The reply is lost after the command ran: the client looks the key up instead of
    sending it again. A 503 before the server saw it: unknown, and still not resent."""
    stamp = slots.lease("job-A")
    proxy = FaultProxy(toolserver.url)
    lost = proxy.add(Rule("lose_response", "/v1/tools/exec", key_contains=":lost"))
    refused = proxy.add(Rule("status_503", "/v1/tools/exec", key_contains=":gone"))
    client = ToolClient(proxy.start(), timeout_s=30)
    count = slots.work(stamp) / "count.txt"
    try:
        args = {"command": "echo ran >> count.txt; echo hi"}
        settled = client.call(
            Envelope.model_validate(envelope(stamp, "job-A:lost")), args, slot_dir=slots.dir(stamp)
        )
        assert settled.reconciled and settled.replayed and settled.result["output"] == "hi\n"
        assert lost.fired == 1 and count.read_text() == "ran\n"
        with pytest.raises(OutcomeUnknown, match="not resent"):
            client.call(
                Envelope.model_validate(envelope(stamp, "job-A:gone")),
                args,
                slot_dir=slots.dir(stamp),
            )
        assert refused.fired == 1 and count.read_text() == "ran\n"
        assert client.decisions["do_not_retry"] == 2 and "resend_after_reconcile" not in (
            client.decisions
        )
    finally:
        client.close()
        proxy.stop()
    assert [e["outcome"] for e in exec_log(toolserver.settings)] == ["applied"]


def path_without_bwrap(tmp_path: Path) -> str:
    """A PATH holding git and bash and nothing else: no bwrap."""
    bin_dir = tmp_path / "bin-no-bwrap"
    bin_dir.mkdir()
    for tool in ("git", "bash"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_without_a_usable_bwrap_exec_is_refused_before_its_intent(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """No bwrap on this process's PATH: exec is refused sandbox_unavailable, nothing is
    recorded or run; under auto the job's own test command still falls back."""
    repo = tmp_path / "repo"
    slots = Slots(settings.with_(sandbox=mode), repo, make_repo(repo))
    stamp = slots.lease("job-A")
    write_job(
        slots.dir(stamp),
        {"job_id": "job-A", "generation": stamp.generation, "test_command": ["true"]},
    )
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path))
    service = ToolService(slots.settings)
    try:
        body = {"envelope": envelope(stamp, "job-A:x"), "args": {"command": "touch ran"}}
        reply = service.call("exec", body)
        assert reply.http_status == 409 and reply.body["error"] == "sandbox_unavailable"
        assert "bubblewrap" in reply.body["message"]
        assert receipt_lines(slots.dir(stamp), "job-A:x") == []
        assert not (slots.work(stamp) / "ran").exists()
        tests = service.call(
            "run_tests", {"envelope": envelope(stamp, "job-A:t", "run_tests"), "args": {}}
        )
        if mode == "auto":
            assert tests.body["result"]["passed"] is True
            assert tests.body["result"]["sandbox"] == "none"
        else:
            assert tests.body["receipt"]["status"] == "failed"
    finally:
        slots.close()


def test_sandbox_off_runs_on_the_host_and_says_so(settings: Settings, tmp_path: Path) -> None:
    """SLOTRUNNER_SANDBOX=off is the operator's choice: exec runs unconfined, in the
    slot's real directory, and the result and the log line record sandbox none."""
    repo = tmp_path / "repo"
    slots = Slots(settings.with_(sandbox="off"), repo, make_repo(repo))
    stamp = slots.lease("job-A")
    service = ToolService(slots.settings)
    try:
        reply = service.call(
            "exec", {"envelope": envelope(stamp, "job-A:pwd"), "args": {"command": "pwd"}}
        )
        result = reply.body["result"]
        assert (result["sandbox"], result["exit_code"]) == ("none", 0)
        assert result["output"].strip() == str(slots.work(stamp).resolve())
        assert reply.log["sandbox"] == "none"
    finally:
        slots.close()
