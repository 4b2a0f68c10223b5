"""One job-id rule (runner/core/ids.py), refused alike at every door that takes a job id."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hooks.check_apply_envelope import EXIT_MALFORMED
from runner.core.ids import JOB_ID_MAX_CHARS, JobIdError, check_job_id, valid_job_id
from runner.core.stamp import SlotState, Stamp, write_stamp
from runner.jobs.models import JobSpec
from runner.worker.attempt_floor import AttemptFloorError, floor_path
from runner.workspace.git import WorkspaceError
from runner.workspace.refs import check_job_id as check_ref_job_id
from tools.envelope import Envelope

CONTROL = ["abc\n", "abc\r", "a\nb", "\nabc", "a\tb", "a\x00b", "a\x1bb", "a\x7fb", "abc\r\n"]
LONGEST = "x" * JOB_ID_MAX_CHARS
TOO_LONG = "x" * (JOB_ID_MAX_CHARS + 1)
BAD = [*CONTROL, TOO_LONG, "", "a b", "a/b", "../etc", ".a", "-a", "a..b", "a.lock", "é"]
GOOD = ["J-1", "run_2024.06.01", "3f2a9c1e-0b7d-4e55-9a51-0c4d2b8e7f10", "a.lock.b", LONGEST]


def spec(job_id: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "repo": "/nowhere",
            "planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]},
        }
    )


def envelope(job_id: str) -> Envelope:
    return Envelope(job_id=job_id, attempt=1, slot_id="S0", generation=1, tool="read_file")


@pytest.mark.parametrize("job_id", BAD)
def test_bad_id_is_refused_by_the_rule(job_id: str) -> None:
    assert not valid_job_id(job_id)
    with pytest.raises(JobIdError, match="is not valid"):
        check_job_id(job_id)


@pytest.mark.parametrize("job_id", GOOD)
def test_good_id_passes_every_door(job_id: str, tmp_path: Path) -> None:
    assert check_job_id(job_id) == job_id
    assert spec(job_id).job_id == job_id
    assert envelope(job_id).job_id == job_id
    check_ref_job_id(job_id)
    assert floor_path(tmp_path, job_id).name == job_id


@pytest.mark.parametrize("job_id", BAD)
def test_bad_id_is_refused_by_the_spec(job_id: str) -> None:
    with pytest.raises(ValidationError, match="job_id"):
        spec(job_id)


@pytest.mark.parametrize("job_id", BAD)
def test_bad_id_is_refused_by_the_envelope(job_id: str) -> None:
    with pytest.raises(ValidationError, match="job_id"):
        envelope(job_id)


@pytest.mark.parametrize("job_id", BAD)
def test_bad_id_is_refused_by_refs_and_the_attempt_floor(job_id: str, tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="cannot be used"):
        check_ref_job_id(job_id)
    with pytest.raises(AttemptFloorError, match="is not valid"):
        floor_path(tmp_path, job_id)


def run(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLOTRUNNER_HOME": str(tmp_path / "home"), "REDIS_URL": ""}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("job_id", ["abc\n", "a\x1bb", TOO_LONG])
def test_bad_id_is_refused_by_the_cli(job_id: str, tmp_path: Path) -> None:
    """Refused before anything is created under the home or any Redis is reached."""
    lease = run(tmp_path, "runner.cli.main", "slots", "lease", "--job", job_id)
    assert lease.returncode == 2 and "--job" in lease.stderr, lease.stderr
    cancel = run(tmp_path, "runner.cli.main", "cancel", job_id)
    assert cancel.returncode == 2 and "is not a job id" in cancel.stderr, cancel.stderr
    for proc in (lease, cancel):
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("job_id", ["abc\n", "a\x00b", TOO_LONG])
def test_bad_id_is_refused_by_the_hook(job_id: str, tmp_path: Path) -> None:
    """The pre-apply hook calls the envelope malformed (65), not a mismatch of two ids."""
    slot = tmp_path / "S0"
    slot.mkdir()
    stamp = Stamp(slot_id="S0", host="h", generation=1, job_id="job-A", attempt=1)
    write_stamp(slot, stamp.model_copy(update={"state": SlotState.LEASED}))
    body: dict[str, Any] = {"job_id": job_id, "generation": 1, "tool": "read_file"}
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    proc = run(
        tmp_path, "hooks.check_apply_envelope", "--slot", str(slot), "--request", str(request)
    )
    assert proc.returncode == EXIT_MALFORMED and "job_id must be" in proc.stderr, proc.stderr


def test_every_accepted_id_names_a_ref_git_accepts(tmp_path: Path) -> None:
    """The rule keeps git's own ref rules ('..', '.lock'): refs need no second check."""
    alphabet = "a.-_"
    candidates = ["".join(p) for n in range(1, 5) for p in itertools.product(alphabet, repeat=n)]
    candidates += [s + suffix for s in ("a", "a.", "a_") for suffix in (".lock", "lock", ".loc")]
    accepted = [c for c in candidates if valid_job_id(c)]
    assert "a..a" not in accepted and "a.lock" not in accepted and "a.a" in accepted
    refs = [f"refs/slotrunner/snapshots/{job_id}/start" for job_id in accepted]
    # check-ref-format takes one name per call: loop in one shell, not one Python call each.
    script = 'for r in "$@"; do git check-ref-format "$r" || echo "refused $r"; done'
    proc = subprocess.run(
        ["sh", "-c", script, "sh", *refs], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
