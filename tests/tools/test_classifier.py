"""The retry classifier: the table cell by cell, attempt limits, deadlines, Retry-After."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.classifier import (
    DEFAULT_DELAY_S,
    MAX_ATTEMPTS,
    MAX_DELAY_S,
    Action,
    Decision,
    FailureKind,
    Why,
    classify,
    format_table,
    parse_retry_after,
    settled_by_receipt,
    table_action,
    table_rows,
)
from tools.registry import TOOLS

NOW = datetime(2025, 3, 4, 12, 0, 0, tzinfo=UTC)

# Written out by hand from docs/architecture.md §Retry table, independently of
# tools.classifier.TABLE.
_FAILURES = ("connect_error", "http_429", "http_5xx", "read_timeout", "connection_lost")
_MUT = ("retry_once", "reconcile", "reconcile", "reconcile", "reconcile")
_READ = ("retry_once", "retry_after_header", "retry_once", "retry_once", "retry_once")
_TESTS = ("retry_once", "retry_only_with_receipt", "do_not_retry", "do_not_retry", "do_not_retry")
_EXEC = ("retry_once", "do_not_retry", "do_not_retry", "do_not_retry", "do_not_retry")
EXPECTED: dict[str, tuple[bool, tuple[str, ...]]] = {
    "apply_patch": (True, _MUT),
    "write_file": (True, _MUT),
    "rm": (True, _MUT),
    "mv": (True, _MUT),
    "git_commit": (True, _MUT),
    "read_file": (False, _READ),
    "list_dir": (False, _READ),
    "git_status": (False, _READ),
    "run_tests": (True, _TESTS),
    "exec": (True, _EXEC),
}
CELLS = [
    (tool, failure, decision)
    for tool, (_, row) in EXPECTED.items()
    for failure, decision in zip(_FAILURES, row, strict=True)
]


def _first_try(tool: str, failure: str, retry_after: str | None = None) -> Decision:
    return classify(
        tool,
        failure,
        attempt=1,
        elapsed_s=0.0,
        deadline_s=600.0,
        retry_after=retry_after,
        now=NOW,
    )


def test_expected_table_covers_the_registry() -> None:
    """The hand-written table names exactly the registry's tools and the failure kinds."""
    assert set(EXPECTED) == set(TOOLS)
    assert tuple(kind.value for kind in FailureKind) == _FAILURES


@pytest.mark.parametrize(("tool", "failure", "decision"), CELLS)
def test_every_cell_on_the_first_try(tool: str, failure: str, decision: str) -> None:
    """Each tool x failure kind gives the documented table's action on the first attempt."""
    assert table_action(tool, failure) == decision
    got = _first_try(tool, failure)
    assert got.action == decision
    assert got.reason == Why.TABLE
    assert got.retries == (
        decision in {"retry_once", "retry_after_header", "retry_only_with_receipt"}
    )
    if not got.retries:
        assert got.delay_s == 0.0


def test_table_rows_match_the_expected_table() -> None:
    """table_rows() is one row per tool and failure, with the right mutating flag and cell."""
    rows = table_rows()
    assert len(rows) == len(TOOLS) * len(FailureKind)
    assert {(r["tool"], r["failure"], r["decision"]) for r in rows} == set(CELLS)
    for row in rows:
        assert set(row) == {"tool", "mutating", "failure", "decision"}
        assert row["mutating"] is EXPECTED[str(row["tool"])][0]
    json.dumps(rows)  # what `slotrunner tools table --json` prints must serialise


def test_format_table_lists_every_tool_and_the_unknown_row() -> None:
    """The human table has a line per tool plus the unknown-tool line, all cells present."""
    text = format_table()
    lines = text.splitlines()
    assert len(lines) == 1 + len(TOOLS) + 1
    for tool, (_, row) in EXPECTED.items():
        line = next(line for line in lines if line.split()[0] == tool)
        assert line.split()[2:] == list(row)
    assert lines[-1].split()[-5:] == ["do_not_retry"] * 5


def test_only_a_sent_exec_is_settled_by_its_receipt() -> None:
    """exec after anything was sent: look the key up, never resend; nothing else is."""
    for tool in [*TOOLS, "nope"]:
        for failure in _FAILURES:
            expected = tool == "exec" and failure != "connect_error"
            assert settled_by_receipt(tool, failure) is expected, (tool, failure)


@pytest.mark.parametrize("failure", _FAILURES)
@pytest.mark.parametrize("tool", ["install_deps", "", "READ_FILE", "read_file "])
def test_unknown_tools_never_retry(tool: str, failure: str) -> None:
    """A tool the registry does not know is do_not_retry, even after a connect error."""
    got = _first_try(tool, failure, retry_after="1")
    assert got == Decision(Action.DO_NOT_RETRY, 0.0, Why.UNKNOWN_TOOL)
    assert table_action(tool, failure) == Action.DO_NOT_RETRY


@pytest.mark.parametrize(
    ("tool", "failure"),
    [(t, f) for t, f, d in CELLS if d == "retry_once"],
)
def test_retry_once_allows_only_the_first_attempt(tool: str, failure: str) -> None:
    """retry_once retries after attempt 1 and refuses from attempt 2 on."""
    assert classify(tool, failure, attempt=1, elapsed_s=0, deadline_s=60, now=NOW).retries
    for attempt in (2, 3, 50):
        got = classify(tool, failure, attempt=attempt, elapsed_s=0, deadline_s=60, now=NOW)
        assert got == Decision(Action.DO_NOT_RETRY, 0.0, Why.ATTEMPTS)


@pytest.mark.parametrize(
    ("tool", "action"),
    [("read_file", Action.RETRY_AFTER_HEADER), ("run_tests", Action.RETRY_ONLY_WITH_RECEIPT)],
)
def test_server_paced_retries_stop_at_max_attempts(tool: str, action: Action) -> None:
    """A 429 retry is allowed up to MAX_ATTEMPTS attempts in all, then refused."""
    for attempt in range(1, MAX_ATTEMPTS):
        got = classify(
            tool, "http_429", attempt=attempt, elapsed_s=0, deadline_s=600, retry_after="2", now=NOW
        )
        assert got == Decision(action, 2.0, Why.TABLE)
    got = classify(
        tool,
        "http_429",
        attempt=MAX_ATTEMPTS,
        elapsed_s=0,
        deadline_s=600,
        retry_after="2",
        now=NOW,
    )
    assert got == Decision(Action.DO_NOT_RETRY, 0.0, Why.ATTEMPTS)


def test_reconcile_is_not_limited_by_attempts_or_deadline() -> None:
    """A mutating call's unknown outcome is always resolved by the receipt, never replayed."""
    got = classify("apply_patch", "read_timeout", attempt=7, elapsed_s=99, deadline_s=10, now=NOW)
    assert got == Decision(Action.RECONCILE, 0.0, Why.TABLE)


def test_a_retry_that_would_end_past_the_deadline_is_refused() -> None:
    """elapsed + delay beyond the deadline gives do_not_retry with reason deadline."""
    ok = classify(
        "read_file", "http_429", attempt=1, elapsed_s=50, deadline_s=60, retry_after="10", now=NOW
    )
    assert ok == Decision(Action.RETRY_AFTER_HEADER, 10.0, Why.TABLE)  # ends exactly at it
    late = classify(
        "read_file", "http_429", attempt=1, elapsed_s=50.5, deadline_s=60, retry_after="10", now=NOW
    )
    assert late == Decision(Action.DO_NOT_RETRY, 0.0, Why.DEADLINE)
    spent = classify("list_dir", "http_5xx", attempt=1, elapsed_s=70, deadline_s=60, now=NOW)
    assert spent.reason == Why.DEADLINE


def test_no_deadline_means_only_the_cap_applies() -> None:
    """deadline_s=inf lets the capped delay through."""
    got = classify(
        "read_file",
        "http_429",
        attempt=1,
        elapsed_s=1e6,
        deadline_s=math.inf,
        retry_after="3600",
        now=NOW,
    )
    assert got == Decision(Action.RETRY_AFTER_HEADER, MAX_DELAY_S, Why.TABLE)


@pytest.mark.parametrize(
    ("header", "expected_s"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("0", 0.0),
        ("7", 7.0),
        (" 7 ", 7.0),
        ("2.5", 2.5),
        ("3600", 3600.0),
        ("-1", None),
        ("+5", None),
        ("NaN", None),
        ("nan", None),
        ("inf", None),
        ("1e3", None),
        ("0x10", None),
        ("soon", None),
        ("9" * 40, None),
        (str(10**9), None),
        ("Mon, 99 Foo 2025 99:99:99 GMT", None),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
        (format_datetime(NOW - timedelta(days=3), usegmt=True), 0.0),
        (format_datetime(NOW + timedelta(days=400), usegmt=True), None),
        ("Tue, 04 Mar 2025 12:00:45 -0000", 45.0),
        ("Tue, 04 Mar 2025 13:00:10 +0100", 10.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", None),
    ],
)
def test_parse_retry_after(header: str | None, expected_s: float | None) -> None:
    """Both Retry-After forms are read; unusable values give None."""
    assert parse_retry_after(header, NOW) == expected_s


def test_parse_retry_after_needs_an_aware_now() -> None:
    """A naive `now` is a programming error, named as such."""
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_retry_after("5", datetime(2025, 1, 1))


def test_now_in_another_zone_compares_correctly() -> None:
    """An HTTP-date is compared with `now` as instants, whatever now's zone."""
    now = NOW.astimezone(timezone(timedelta(hours=-7)))
    header = format_datetime(NOW + timedelta(seconds=12), usegmt=True)
    assert parse_retry_after(header, now) == 12.0


@pytest.mark.parametrize("header", ["-5", "garbage", "NaN", "", "99999999999", None])
def test_bad_retry_after_uses_the_bounded_default(header: str | None) -> None:
    """A missing or bad header still gives a retry, after the default delay."""
    got = _first_try("read_file", "http_429", retry_after=header)
    assert got == Decision(Action.RETRY_AFTER_HEADER, DEFAULT_DELAY_S, Why.TABLE)


def test_retry_after_is_capped() -> None:
    """A plausible but long Retry-After is cut to MAX_DELAY_S."""
    got = _first_try("git_status", "http_429", retry_after="7200")
    assert got.delay_s == MAX_DELAY_S


def test_retry_once_honours_a_5xx_retry_after() -> None:
    """A 503 with Retry-After waits what the server asked (capped) before the one retry."""
    assert _first_try("read_file", "http_5xx", retry_after="4").delay_s == 4.0
    assert _first_try("read_file", "read_timeout").delay_s == DEFAULT_DELAY_S


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempt": 0}, "attempt"),
        ({"attempt": -1}, "attempt"),
        ({"attempt": True}, "attempt"),
        ({"attempt": 1.0}, "attempt"),
        ({"elapsed_s": -0.1}, "elapsed_s"),
        ({"elapsed_s": math.nan}, "elapsed_s"),
        ({"elapsed_s": math.inf}, "elapsed_s"),
        ({"deadline_s": -1.0}, "deadline_s"),
        ({"deadline_s": math.nan}, "deadline_s"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], message: str) -> None:
    """Nonsense numbers raise ValueError naming the argument."""
    args: dict[str, object] = {"attempt": 1, "elapsed_s": 0.0, "deadline_s": 60.0, "now": NOW}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        classify("read_file", "http_429", **args)  # type: ignore[arg-type]


def test_unknown_failure_kind_is_named() -> None:
    """A failure kind outside the enum raises ValueError listing the known ones."""
    with pytest.raises(ValueError, match=r"http_418.*connect_error"):
        _first_try("read_file", "http_418")


_headers = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.just(UTC),
    ).map(lambda d: format_datetime(d, usegmt=True)),
)


@given(
    tool=st.sampled_from([*TOOLS, "nope"]),
    failure=st.sampled_from(list(FailureKind)),
    attempt=st.integers(min_value=1, max_value=10),
    elapsed_s=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    budget_s=st.one_of(st.floats(min_value=0, max_value=1e7, allow_nan=False), st.just(math.inf)),
    header=_headers,
)
def test_delay_is_bounded_and_inside_the_deadline(
    tool: str,
    failure: FailureKind,
    attempt: int,
    elapsed_s: float,
    budget_s: float,
    header: str | None,
) -> None:
    """For any input the delay is in [0, MAX_DELAY_S] and a retry never ends past the deadline."""
    got = classify(
        tool,
        failure,
        attempt=attempt,
        elapsed_s=elapsed_s,
        deadline_s=budget_s,
        retry_after=header,
        now=NOW,
    )
    assert 0.0 <= got.delay_s <= MAX_DELAY_S
    if got.retries:
        assert elapsed_s + got.delay_s <= budget_s
        assert table_action(tool, failure) == got.action
    else:
        assert got.delay_s == 0.0
    if tool == "nope":
        assert got.action == Action.DO_NOT_RETRY


def test_the_client_stops_at_the_classifiers_attempt_cap() -> None:
    """One number: a read answered 429 forever is sent MAX_ATTEMPTS times in all, then
    surfaced as a transport failure; the client keeps no cap of its own."""
    import httpx

    from runner.core.stamp import utc_now
    from tools import client as tool_client
    from tools.envelope import Envelope
    from tools.reasons import Reason

    assert not hasattr(tool_client, "MAX_ATTEMPTS") and not hasattr(tool_client, "MAX_RESENDS")
    sent: list[httpx.Request] = []

    def saturated(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(429, headers={"retry-after": "0"}, json={"error": "saturated"})

    client = tool_client.ToolClient(
        "http://toolserver.invalid", transport=httpx.MockTransport(saturated), clock=utc_now
    )
    envelope = Envelope(job_id="job-A", attempt=1, slot_id="S1", generation=1, tool="read_file")
    with pytest.raises(tool_client.TransportFailed) as failed:
        client.call(envelope, {"path": "README"}, deadline_s=60)
    client.close()
    assert len(sent) == MAX_ATTEMPTS
    assert failed.value.failure is FailureKind.HTTP_429
    assert failed.value.reason is Reason.TRANSPORT_FAILED
