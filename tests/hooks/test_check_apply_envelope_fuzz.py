"""The envelope hook's request files, fuzzed (issue #15): whatever the bytes, an exit code of
docs/architecture.md §Envelope hook, one line on stderr, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from hooks.check_apply_envelope import EXIT_CODES, EXIT_MALFORMED, EXIT_USAGE, main
from runner.core.stamp import SlotState, Stamp, iso, utc_now, write_stamp
from tests.support.fuzz import JSON, STRINGS, fuzz_settings, stderr_lines
from tests.support.repos import REPO
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore, Status

DOCUMENTED = {0, *EXIT_CODES.values(), 64, 65, 66}
GOOD = {
    "job_id": "job-A",
    "attempt": 1,
    "slot_id": "S7",
    "generation": 4,
    "tool": "apply_patch",
    "idempotency_key": "job-A:1",
}


def _slot(tmp_path: Path) -> Path:
    """A slot leased to job-A at generation 4, with a key already bound to job-B."""
    slot = tmp_path / "S7"
    slot.mkdir()
    now = utc_now()
    write_stamp(
        slot,
        Stamp(
            slot_id="S7",
            host="h",
            generation=4,
            job_id="job-A",
            attempt=1,
            state=SlotState.LEASED,
            leased_at=iso(now),
            lease_expires_at=iso(now + timedelta(seconds=600)),
        ),
    )
    store = ReceiptStore(slot)
    begun = store.begin(
        key="taken", job_id="job-B", attempt=1, slot_id="S7", generation=3, tool="write_file"
    )
    store.finish(begun.receipt, Status.APPLIED)
    return slot


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    """The good request with fields changed, dropped or added."""
    field = st.sampled_from([*GOOD, "relpath", "envelope", "\x00"])
    value = st.sampled_from([4, 3, 2**63, -1, 0, True, None, "taken", "job-B", "S8", "rm"])
    drop = draw(st.sets(st.sampled_from(list(GOOD)), max_size=2))
    changes = draw(st.dictionaries(field, value | STRINGS | JSON, max_size=3))
    return {**{k: v for k, v in GOOD.items() if k not in drop}, **changes}


def _as_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


CONTENTS = st.one_of(
    st.binary(max_size=200),
    _mutated().map(_as_bytes),
    JSON.map(_as_bytes),
    _mutated().map(lambda r: json.dumps(r).encode()[: len(json.dumps(r)) // 2]),  # torn
    st.sampled_from(
        [
            b"",
            b"\xef\xbb\xbf" + _as_bytes(GOOD),  # a BOM
            _as_bytes(GOOD).replace(b"4", b"1" * 5000, 1),  # past int's digit limit
            _as_bytes(GOOD).replace(b"4", b"NaN", 1),
            _as_bytes(GOOD).replace(b"4", b"1e400", 1),
            _as_bytes(GOOD).replace(b'"job-A:1"', b'"\\ud800"'),  # a lone surrogate
            _as_bytes(GOOD).replace(b'"apply_patch"', b'"\\udcff"'),
            b"[" * 100_000 + b"]" * 100_000,
            b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
            _as_bytes(GOOD) + b"\n" + _as_bytes(GOOD),
        ]
    ),
)


def _check(result: Any) -> None:
    assert result.exit_code in DOCUMENTED, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr
    lines = stderr_lines(result.stderr)
    if result.exit_code == 0:
        assert result.stdout == "ok\n" and result.stderr == ""
    elif result.exit_code == EXIT_USAGE:  # click's usage block, with one Error: line
        assert len([line for line in lines if line.startswith("Error: ")]) == 1, result.stderr
    else:
        assert len(lines) == 1, result.stderr


def test_arbitrary_request_files(tmp_path: Path) -> None:
    """Bytes, JSON, mutated and torn requests, from a file and from stdin: a documented
    exit code with one line, and 65 whenever the bytes are not a JSON document."""
    slot = _slot(tmp_path)
    target = tmp_path / "request.json"
    runner = CliRunner()

    @fuzz_settings(300)
    @given(content=CONTENTS, stdin=st.booleans())
    def one(content: bytes, stdin: bool) -> None:
        target.write_bytes(content)
        args = ["--slot", str(slot), "--request", "-" if stdin else str(target)]
        result = runner.invoke(main, args, input=content if stdin else None)
        _check(result)
        try:
            json.loads(content)
        except (ValueError, RecursionError):
            assert result.exit_code == EXIT_MALFORMED, result.stderr

    one()


def test_arbitrary_arguments(tmp_path: Path) -> None:
    """Whatever the argument vector: a documented exit code (64 for bad usage), one line."""
    slot = _slot(tmp_path)
    (tmp_path / "good.json").write_bytes(_as_bytes(GOOD))
    words = st.sampled_from(
        ["--slot", "--request", str(slot), str(tmp_path / "good.json"), "-", "--help", "-x"]
    )

    @fuzz_settings(60)
    @given(argv=st.lists(words | STRINGS, max_size=6))
    def one(argv: list[str]) -> None:
        result = CliRunner().invoke(main, argv, input=b"{}")
        if "--help" in argv and result.exit_code == 0:
            return
        _check(result)

    one()


def test_a_real_process_over_hostile_requests(tmp_path: Path) -> None:
    """`python -m hooks.check_apply_envelope` as a real process: the same codes and lines."""
    slot = _slot(tmp_path)
    cases = {
        _as_bytes(GOOD).replace(b"4", b"1" * 5000, 1): EXIT_MALFORMED,
        _as_bytes({**GOOD, "idempotency_key": "taken"}): EXIT_CODES[Reason.KEY_BOUND_TO_OTHER_JOB],
    }
    for number, (content, code) in enumerate(cases.items()):
        path = tmp_path / f"r{number}.json"
        path.write_bytes(content)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hooks.check_apply_envelope",
                "--slot",
                str(slot),
                "--request",
                str(path),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code, (number, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(stderr_lines(proc.stderr)) == (0 if code == 0 else 1), proc.stderr
