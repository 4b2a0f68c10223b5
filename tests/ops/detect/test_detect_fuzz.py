"""`ops detect` and `ops verify` over hostile log lines (issue #15): arbitrary bytes, torn
lines and well-shaped records with wrong types, mixed into a synthetic log. Exit 0, 1 or
2 as documented, every broken line counted where it is, never a traceback, and a real
incident among the garbage still found."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from ops.testing.synthlog import clean_log
from runner.cli.main import main
from runner.core import events
from tests.support.detectlog import lease_line, log_line, result_line
from tests.support.fuzz import JSON, STRINGS, fuzz_settings, stderr_lines

# An apply into a slot nobody ever leased: an incident wherever it stands.
GHOST = result_line("ghost-job", 1, "ghost-key", slot="S-ghost", host="h-ghost")
GOOD_FIELDS = json.loads(result_line("job-x", 3, "k-x", slot="S9", host="h9"))
LEASE_FIELDS = json.loads(lease_line("job-x", 3, host="h9", slot="S9"))


def _retyped(fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """The record with one field the detector reads given a value of the wrong type."""
    read = [k for k in fields if k not in ("event", "outcome", "tool", "ts", "host")]
    wrong: st.SearchStrategy[Any] = st.sampled_from(["1", 1.5, True, None, [], {}, ""]) | JSON
    return st.tuples(st.sampled_from(read), wrong).map(
        lambda change: json.dumps({**fields, change[0]: change[1]}).encode()
    )


def _certainly_malformed() -> st.SearchStrategy[bytes]:
    """Lines both commands must count as malformed (the tests know where they are)."""
    good = json.dumps(GOOD_FIELDS).encode()
    torn = st.integers(1, len(good) - 2).map(lambda cut: good[:cut])
    wrong = _retyped(GOOD_FIELDS).filter(_mistyped_apply) | _retyped(LEASE_FIELDS).filter(
        _mistyped_lease
    )
    return torn.filter(lambda line: line.strip() != b"") | wrong


def _mistyped_apply(line: bytes) -> bool:
    obj = json.loads(line)
    ints = ("attempt", "slot_generation")
    strings = ("job_id", "slot_id", "idempotency_key")
    key = obj["idempotency_key"]
    return (
        any(type(obj[k]) is not int for k in ints)
        or any(type(obj[k]) is not str for k in strings)
        or key == ""  # the one field that must not be empty
        or not (obj.get("receipt_job") is None or type(obj["receipt_job"]) is str)
    )


def _mistyped_lease(line: bytes) -> bool:
    obj = json.loads(line)
    return any(type(obj[k]) is not int for k in ("generation", "attempt")) or any(
        type(obj[k]) is not str for k in ("job_id", "slot_id")
    )


def _noise() -> st.SearchStrategy[bytes]:
    """Lines that may or may not be records: anything, as long as it is one line."""
    records = st.dictionaries(
        st.sampled_from(["event", "ts", "host", *GOOD_FIELDS, *LEASE_FIELDS]) | STRINGS,
        st.sampled_from([events.TOOL_RESULT, events.SLOT_LEASED, "applied"]) | JSON,
        max_size=8,
    ).map(lambda obj: json.dumps(obj).encode())
    return (st.binary(max_size=120) | records | JSON.map(lambda v: json.dumps(v).encode())).map(
        lambda line: line.replace(b"\n", b" ")
    )


def _ops(env: dict[str, str], *args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["ops", *args], env=env, input=stdin, prog_name="slotrunner")


def _check(result: Result) -> list[dict[str, Any]]:
    """The documented exit codes, `error:` lines only, no traceback; the JSON items."""
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert all(line.startswith("error: ") for line in stderr_lines(result.stderr)), result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_garbage_among_real_traffic(tmp_path: Path) -> None:
    """Broken lines at random places in a clean log with one unowned apply: both verbs
    exit 1 with the incident found, count every broken line at its line number and
    report no line of the real traffic as malformed."""
    log = tmp_path / "log.jsonl"
    clean_log(log, 120, seed=3)
    traffic = log.read_bytes().splitlines()
    env = {"SLOTRUNNER_HOME": str(tmp_path / "home")}

    @fuzz_settings(100)
    @given(
        broken=st.lists(
            st.tuples(st.integers(0, len(traffic)), _certainly_malformed()), max_size=6
        ),
        noise=st.lists(st.tuples(st.integers(0, len(traffic)), _noise()), max_size=6),
        ghost_at=st.integers(0, len(traffic)),
        crlf=st.booleans(),
    )
    def one(
        broken: list[tuple[int, bytes]], noise: list[tuple[int, bytes]], ghost_at: int, crlf: bool
    ) -> None:
        tagged: list[tuple[float, str, bytes]] = [
            (i, "traffic", line) for i, line in enumerate(traffic)
        ]
        tagged += [(i - 0.5, "broken", line) for i, line in broken]
        tagged += [(i - 0.25, "noise", line) for i, line in noise]
        tagged.append((ghost_at - 0.1, "ghost", GHOST))
        tagged.sort(key=lambda t: t[0])
        end = b"\r\n" if crlf else b"\n"
        log.write_bytes(b"".join(line + end for _, _, line in tagged))
        where = {tag: [n for n, (_, t, _) in enumerate(tagged, 1) if t == tag] for tag in
                 ("traffic", "broken", "ghost")}  # fmt: skip
        for verb in ("detect", "verify"):
            result = _ops(env, verb, "--json", str(log))
            items = _check(result)
            assert result.exit_code == 1, (verb, result.stderr)
            found = {(i["kind"], i["line"]) for i in items if i["kind"] != "summary"}
            assert ("unowned_apply", where["ghost"][0]) in found, (verb, items)
            malformed = {line for kind, line in found if kind == "malformed"}
            assert set(where["broken"]) <= malformed, (verb, where["broken"], malformed)
            assert not malformed & set(where["traffic"]), verb
            summary = items[-1]
            assert summary["kind"] == "summary" and summary["lines"] == len(tagged)
            assert summary["malformed"] == len(malformed)

    one()


def test_whole_files_of_anything(tmp_path: Path) -> None:
    """A file (or stdin, or several files, or gzip) of arbitrary lines or bytes: exit 0,
    1 or 2, one `error:` line per unusable input, never a traceback."""
    env = {"SLOTRUNNER_HOME": str(tmp_path / "home")}
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"

    @fuzz_settings(150)
    @given(
        lines=st.lists(_noise() | _certainly_malformed(), max_size=8),
        raw=st.binary(max_size=300),
        how=st.sampled_from(["file", "stdin", "two", "gzip", "raw", "torn_gzip"]),
        verb=st.sampled_from(["detect", "verify"]),
        as_json=st.booleans(),
    )
    def one(lines: list[bytes], raw: bytes, how: str, verb: str, as_json: bool) -> None:
        text = b"\n".join(lines)
        first.write_bytes(raw if how == "raw" else text)
        packed = gzip.compress(text)
        second.write_bytes(packed[: len(packed) // 2] if how == "torn_gzip" else packed)
        paths = {
            "stdin": ["-"],
            "two": [str(first), str(second)],
            "gzip": [str(second)],
            "torn_gzip": [str(second)],
        }.get(how, [str(first)])
        flags = ["--json"] if as_json else []
        result = _ops(env, verb, *flags, *paths, stdin=text if how == "stdin" else None)
        _check(result) if as_json else _check_plain(result)
        assert len(stderr_lines(result.stderr)) <= len(paths)
        if how == "torn_gzip" and packed[: len(packed) // 2]:
            assert result.exit_code == 2, result.stderr

    one()


def _check_plain(result: Result) -> None:
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert all(line.startswith("error: ") for line in stderr_lines(result.stderr)), result.stderr


def test_log_line_helpers_make_the_records_the_fuzz_breaks() -> None:
    """The base records are whole, so every break the fuzz makes is its own."""
    assert json.loads(GHOST)["outcome"] == events.OUTCOME_APPLIED
    assert json.loads(log_line(events.SLOT_LEASED))["event"] == events.SLOT_LEASED
    assert not _mistyped_apply(json.dumps(GOOD_FIELDS).encode())
    assert not _mistyped_lease(json.dumps(LEASE_FIELDS).encode())
