"""The pre-apply hook's CLI: every exit code and every bad input, without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from hooks.check_apply_envelope import EXIT_CODES, main
from runner.core.stamp import SlotState, Stamp, iso, read_stamp, utc_now, write_stamp
from tools.envelope import is_mutating, parse_request, verdict
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore, Status


def leased_slot(
    tmp_path: Path,
    *,
    job: str = "job-A",
    generation: int = 4,
    expires_in_s: float = 600,
    state: SlotState = SlotState.LEASED,
) -> Path:
    slot = tmp_path / "S7"
    slot.mkdir()
    now = utc_now()
    write_stamp(
        slot,
        Stamp(
            slot_id="S7",
            host="h",
            generation=generation,
            job_id=job,
            attempt=1,
            state=state,
            leased_at=iso(now),
            lease_expires_at=iso(now + timedelta(seconds=expires_in_s)),
        ),
    )
    return slot


def request(tmp_path: Path, **fields: Any) -> Path:
    body = {
        "job_id": "job-A",
        "generation": 4,
        "tool": "apply_patch",
        "idempotency_key": "job-A:apply:pkg/lock.py:1",
        "relpath": "pkg/lock.py",
    }
    body.update(fields)
    body = {k: v for k, v in body.items() if v is not None}
    path = tmp_path / "apply.json"
    path.write_text(json.dumps(body))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hooks.check_apply_envelope", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ok_prints_ok_and_exits_zero(tmp_path: Path) -> None:
    """A request matching the slot's stamp passes: 'ok' on stdout, exit 0."""
    slot = leased_slot(tmp_path)
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path)))
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "ok", "")


@pytest.mark.parametrize(
    ("fields", "code", "reason"),
    [
        ({"job_id": "job-B"}, 2, "slot_job_mismatch"),
        ({"generation": 3}, 3, "stale_generation"),
        ({"generation": 5}, 3, "stale_generation"),
        ({"attempt": 2}, 3, "stale_generation"),
        ({"idempotency_key": None}, 4, "missing_idempotency_key"),
        ({"idempotency_key": ""}, 4, "missing_idempotency_key"),
        ({"slot_id": "S8"}, 2, "slot_job_mismatch"),
    ],
)
def test_refusals_exit_with_their_codes(
    tmp_path: Path, fields: dict[str, Any], code: int, reason: str
) -> None:
    """Each refusal reason prints its name on stderr and exits with its code
    (docs/architecture.md §Envelope hook)."""
    slot = leased_slot(tmp_path)
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path, **fields)))
    assert proc.returncode == code
    assert proc.stderr.strip() == reason
    assert proc.stdout == ""


def test_expired_lease_exits_5(tmp_path: Path) -> None:
    """A lease past its expiry refuses every call with lease_expired (exit 5)."""
    slot = leased_slot(tmp_path, expires_in_s=-1)
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path)))
    assert (proc.returncode, proc.stderr.strip()) == (5, "lease_expired")


def test_idle_slot_refuses_its_last_holder(tmp_path: Path) -> None:
    """After release the slot has no holder: the old job's call is a slot_job_mismatch."""
    slot = tmp_path / "S7"
    slot.mkdir()
    write_stamp(slot, Stamp(slot_id="S7", host="h", generation=4))
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path)))
    assert (proc.returncode, proc.stderr.strip()) == (2, "slot_job_mismatch")


def test_key_bound_to_other_job_exits_6(tmp_path: Path) -> None:
    """A key already receipted for another job is refused with exit 6."""
    slot = leased_slot(tmp_path, job="job-B")
    store = ReceiptStore(slot)
    begun = store.begin(
        key="shared-key", job_id="job-A", attempt=1, slot_id="S7", generation=3, tool="write_file"
    )
    store.finish(begun.receipt, Status.APPLIED)
    proc = run_cli(
        "--slot",
        str(slot),
        "--request",
        str(request(tmp_path, job_id="job-B", idempotency_key="shared-key")),
    )
    assert (proc.returncode, proc.stderr.strip()) == (6, "key_bound_to_other_job")


def test_read_only_tool_needs_no_key(tmp_path: Path) -> None:
    """read_file is not mutating: no idempotency key is required."""
    slot = leased_slot(tmp_path)
    proc = run_cli(
        "--slot",
        str(slot),
        "--request",
        str(request(tmp_path, tool="read_file", idempotency_key=None)),
    )
    assert proc.returncode == 0


def test_unknown_tool_is_treated_as_mutating(tmp_path: Path) -> None:
    """An unknown tool without a key fails closed (missing_idempotency_key)."""
    slot = leased_slot(tmp_path)
    proc = run_cli(
        "--slot",
        str(slot),
        "--request",
        str(request(tmp_path, tool="format_disk", idempotency_key=None)),
    )
    assert proc.returncode == 4


def test_missing_stamp_exits_66(tmp_path: Path) -> None:
    """A slot directory without stamp.json: exit 66 with a message naming the file."""
    slot = tmp_path / "S9"
    slot.mkdir()
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path)))
    assert proc.returncode == 66
    assert "stamp.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_stamp_exits_66(tmp_path: Path) -> None:
    """A stamp that is not a stamp is reported, not crashed on."""
    slot = tmp_path / "S9"
    slot.mkdir()
    (slot / "stamp.json").write_text("{not json")
    proc = run_cli("--slot", str(slot), "--request", str(request(tmp_path)))
    assert proc.returncode == 66
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"job_id": "job-A"}', "generation"),
        ('{"job_id": "job-A", "generation": "4", "tool": "x"}', "generation must be an integer"),
        ('{"job_id": 7, "generation": 4, "tool": "x"}', "job_id"),
        ('{"job_id": "a", "generation": 4, "tool": "x", "attempt": "1"}', "attempt"),
    ],
)
def test_malformed_request_exits_65(tmp_path: Path, content: str, needle: str) -> None:
    """A request that is not a well-formed envelope exits 65 and says what is wrong."""
    slot = leased_slot(tmp_path)
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = run_cli("--slot", str(slot), "--request", str(path))
    assert proc.returncode == 65
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_request_file_exits_65(tmp_path: Path) -> None:
    """A request path that does not exist is named in the error."""
    slot = leased_slot(tmp_path)
    proc = run_cli("--slot", str(slot), "--request", str(tmp_path / "nope.json"))
    assert proc.returncode == 65
    assert "nope.json" in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--slot", "S"), "--request"),
        (("--request", "r.json"), "--slot"),
        (("--slot", "S", "--request"), "--request"),
        (("--slot", "S", "--request", "r.json", "--bogus"), "--bogus"),
        (("--slot", "S", "--request", "r.json", "extra"), "extra"),
    ],
)
def test_bad_usage_exits_64(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    """Missing, unknown or extra arguments are bad usage (64, not click's 2), explained."""
    proc = run_cli(*args)
    assert proc.returncode == 64
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_exits_zero_and_lists_the_exit_codes() -> None:
    """--help is not bad usage: it prints the options and the exit codes, exit 0."""
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "--slot" in proc.stdout and "66 no stamp" in proc.stdout


def test_a_slot_path_that_is_a_file_exits_66(tmp_path: Path) -> None:
    """A --slot that is not a directory cannot hold a stamp: 66, no traceback."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    proc = run_cli("--slot", str(not_a_dir), "--request", str(request(tmp_path)))
    assert proc.returncode == 66
    assert "Traceback" not in proc.stderr


def test_a_request_that_is_a_directory_or_too_deep_exits_65(tmp_path: Path) -> None:
    """A request path naming a directory, or JSON nested past the parser, is malformed."""
    slot = leased_slot(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path in (tmp_path, deep):
        proc = run_cli("--slot", str(slot), "--request", str(path))
        assert proc.returncode == 65, proc.stderr
        assert "malformed request" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_request_from_stdin(tmp_path: Path) -> None:
    """'--request -' reads the request from standard input."""
    slot = leased_slot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "hooks.check_apply_envelope", "--slot", str(slot), "--request", "-"],
        input=request(tmp_path).read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0


def test_exit_codes_cover_every_refusal_the_hook_can_give(tmp_path: Path) -> None:
    """The pure verdict and the CLI agree: the CLI exits with the code of its reason."""
    slot = leased_slot(tmp_path)
    req = parse_request(json.loads(request(tmp_path, generation=2).read_text()))
    stamp = read_stamp(slot)
    assert stamp is not None
    reason = verdict(
        stamp,
        job_id=req.job_id,
        generation=req.generation,
        attempt=req.attempt,
        idempotency_key=req.idempotency_key,
        mutating=is_mutating(req.tool),
        now=utc_now(),
        slot_id=req.slot_id,
    )
    assert reason is Reason.STALE_GENERATION
    args = ["--slot", str(slot), "--request", str(request(tmp_path, generation=2))]
    assert main.main(args, standalone_mode=False) == EXIT_CODES[reason]
