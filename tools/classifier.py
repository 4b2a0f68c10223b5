"""The retry classifier: may a failed tool call be sent again, and after how long?

No transport retry happens unless this table allows it for that tool and that
failure (docs/architecture.md §I4). The table is the policy; :func:`classify` only adds the limits
that apply to every cell: how many attempts, how long to wait, and the job's
deadline. It is a pure function: the caller passes the clock readings in.

    retry class  connect_error  http_429                 http_5xx      read_timeout  connection_lost
    mutating     retry_once     reconcile                reconcile     reconcile     reconcile
    read         retry_once     retry_after_header       retry_once    retry_once    retry_once
    tests        retry_once     retry_only_with_receipt  do_not_retry  do_not_retry  do_not_retry
    exec         retry_once     do_not_retry             do_not_retry  do_not_retry  do_not_retry
    (unknown tool: do_not_retry for every failure, even connect_error)

``connect_error`` means nothing was sent, so a second try cannot apply anything
twice. For a mutating tool anything after that is *outcome unknown*: the server may
have applied the call and then failed to answer (a 5xx after the effect, a lost
response), and even a 429 is only a claim we cannot check without the receipt. So
the answer is ``reconcile`` (look the idempotency key up in the receipt store),
never a blind replay. ``retry_only_with_receipt`` means the retry must carry the
same idempotency key, so a server that did run the tests answers with the original
receipt instead of running them again. ``exec`` runs any command, so nothing sent is
ever sent again; the client settles a lost outcome by looking the key up, without a
resend (``tools.client``), and an intent with no outcome stays ``outcome_unknown``.

Every number of every retry lives below the table, here and nowhere else; the
client's loops (``tools.client``) take theirs from this module::

    MAX_ATTEMPTS          5     attempts of one call in all (the first included)
    RETRY_ONCE_ATTEMPTS   2     ... for retry_once: exactly one more
    DEFAULT_DELAY_S       1.0   the wait when the server gave no usable Retry-After
    MAX_DELAY_S           60.0  no single wait is longer
    CALL_BACKOFF          0.05 s doubling to 5 s (+0.05 s jitter): between attempts
                                when a decision names no wait of its own
    RECONCILE_BACKOFF     0.1 s doubling to 1 s (+0.1 s jitter): between receipt
                                lookups while an outcome is unknown
    MAX_RESENDS           3     resends of a key the receipt store says never applied
    RESEND_5XX_DELAY_S    0.2   the wait after such a resend was answered 5xx
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from types import MappingProxyType

from tools.registry import TOOLS, RetryClass


class FailureKind(StrEnum):
    """What went wrong on the wire, as the client saw it."""

    CONNECT_ERROR = "connect_error"  # nothing was sent
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    READ_TIMEOUT = "read_timeout"  # sent, no answer in time
    CONNECTION_LOST = "connection_lost"  # sent, the connection dropped before an answer


class Action(StrEnum):
    RETRY_AFTER_HEADER = "retry_after_header"
    RETRY_ONCE = "retry_once"
    RETRY_ONLY_WITH_RECEIPT = "retry_only_with_receipt"
    RECONCILE = "reconcile"
    DO_NOT_RETRY = "do_not_retry"


class Why(StrEnum):
    """Why a decision is what it is (``Decision.reason``)."""

    TABLE = "table"  # the table cell, unchanged
    UNKNOWN_TOOL = "unknown_tool"
    ATTEMPTS = "attempts"  # the cell allows a retry, but not this many
    DEADLINE = "deadline"  # the retry would end past the job's deadline


_F = FailureKind
_A = Action

TABLE: Mapping[RetryClass, Mapping[FailureKind, Action]] = MappingProxyType(
    {
        RetryClass.MUTATING: MappingProxyType(
            {
                _F.CONNECT_ERROR: _A.RETRY_ONCE,
                _F.HTTP_429: _A.RECONCILE,
                _F.HTTP_5XX: _A.RECONCILE,
                _F.READ_TIMEOUT: _A.RECONCILE,
                _F.CONNECTION_LOST: _A.RECONCILE,
            }
        ),
        RetryClass.READ: MappingProxyType(
            {
                _F.CONNECT_ERROR: _A.RETRY_ONCE,
                _F.HTTP_429: _A.RETRY_AFTER_HEADER,
                _F.HTTP_5XX: _A.RETRY_ONCE,
                _F.READ_TIMEOUT: _A.RETRY_ONCE,
                _F.CONNECTION_LOST: _A.RETRY_ONCE,
            }
        ),
        RetryClass.TESTS: MappingProxyType(
            {
                _F.CONNECT_ERROR: _A.RETRY_ONCE,
                _F.HTTP_429: _A.RETRY_ONLY_WITH_RECEIPT,
                _F.HTTP_5XX: _A.DO_NOT_RETRY,
                _F.READ_TIMEOUT: _A.DO_NOT_RETRY,
                _F.CONNECTION_LOST: _A.DO_NOT_RETRY,
            }
        ),
        RetryClass.EXEC: MappingProxyType(
            {
                _F.CONNECT_ERROR: _A.RETRY_ONCE,
                _F.HTTP_429: _A.DO_NOT_RETRY,
                _F.HTTP_5XX: _A.DO_NOT_RETRY,
                _F.READ_TIMEOUT: _A.DO_NOT_RETRY,
                _F.CONNECTION_LOST: _A.DO_NOT_RETRY,
            }
        ),
    }
)

# Actions that send the call again after ``delay_s``.
RETRY_ACTIONS = frozenset({_A.RETRY_AFTER_HEADER, _A.RETRY_ONCE, _A.RETRY_ONLY_WITH_RECEIPT})

# Attempts in all (the first included) for a server-paced retry (429): more than a
# one-shot retry, but never forever: a server that stays saturated is surfaced to
# the job, not hidden. The client's retry loop stops at the same number.
MAX_ATTEMPTS = 5
# retry_once: the first attempt and exactly one more.
RETRY_ONCE_ATTEMPTS = 2
# The wait used when the server gave no usable Retry-After.
DEFAULT_DELAY_S = 1.0
# No single wait is longer than this, whatever the server asks for.
MAX_DELAY_S = 60.0
# A Retry-After further out than this is not a plausible hint but garbage or an
# overflow: it is ignored (the default applies) rather than honoured up to the cap.
MAX_PLAUSIBLE_RETRY_AFTER_S = 24 * 3600.0


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial_s`` doubling up to ``max_s``."""

    initial_s: float
    max_s: float
    jitter_s: float


# Between attempts of one call when the decision names no wait of its own.
CALL_BACKOFF = Backoff(initial_s=0.05, max_s=5.0, jitter_s=0.05)
# Between receipt lookups while a call's outcome is unknown: the server may be
# restarting (a crash between intent and outcome), so look often, for the deadline.
RECONCILE_BACKOFF = Backoff(initial_s=0.1, max_s=1.0, jitter_s=0.1)
# Resends of a key the receipt store says never applied; the same key each time, so
# the server applies it at most once however many arrive.
MAX_RESENDS = 3
# After a resend was answered 5xx, look the key up again this much later.
RESEND_5XX_DELAY_S = 0.2

_DELTA_SECONDS = re.compile(r"\d{1,20}(\.\d{1,9})?")


@dataclass(frozen=True)
class Decision:
    action: Action
    delay_s: float
    reason: str

    @property
    def retries(self) -> bool:
        """True when the call is to be sent again after ``delay_s``."""
        return self.action in RETRY_ACTIONS


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value, or None when it is unusable.

    Both forms of RFC 9110 are read: delta-seconds (``"120"``) and an HTTP-date
    (``"Wed, 21 Oct 2015 07:28:00 GMT"``, compared with ``now``; a date in the past
    means 0). Empty, negative, non-numeric, NaN and implausibly large values give
    None. ``now`` must be timezone-aware.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _DELTA_SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": RFC 5322 says UTC, source unknown
            when = when.replace(tzinfo=UTC)
        try:
            seconds = max(0.0, (when - now).total_seconds())
        except OverflowError:
            return None
    if not math.isfinite(seconds) or seconds > MAX_PLAUSIBLE_RETRY_AFTER_S:
        return None
    return seconds


def table_action(tool: str, failure: FailureKind | str) -> Action:
    """The table cell for a tool and a failure (``do_not_retry`` for unknown tools)."""
    kind = _failure_kind(failure)
    spec = TOOLS.get(tool)
    if spec is None:
        return Action.DO_NOT_RETRY
    return TABLE[spec.retry_class][kind]


def classify(
    tool: str,
    failure: FailureKind | str,
    *,
    attempt: int,
    elapsed_s: float,
    deadline_s: float,
    retry_after: str | None = None,
    now: datetime,
) -> Decision:
    """Decide what to do after ``attempt`` (1 = the first try) of ``tool`` failed.

    ``elapsed_s`` is the time the job has used and ``deadline_s`` its whole budget
    (``math.inf`` for none). ``retry_after`` is the raw header value, if any.
    A retry is allowed only when its wait ends inside the deadline.
    """
    kind = _failure_kind(failure)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    if math.isnan(elapsed_s) or elapsed_s < 0 or math.isinf(elapsed_s):
        raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s!r}")
    if math.isnan(deadline_s) or deadline_s < 0:
        raise ValueError(f"deadline_s must be a number >= 0, got {deadline_s!r}")

    if tool not in TOOLS:
        return Decision(Action.DO_NOT_RETRY, 0.0, Why.UNKNOWN_TOOL)
    action = table_action(tool, kind)
    if action not in RETRY_ACTIONS:
        return Decision(action, 0.0, Why.TABLE)

    # Attempts in all, the first included: retry_once allows exactly one more.
    max_attempts = RETRY_ONCE_ATTEMPTS if action is Action.RETRY_ONCE else MAX_ATTEMPTS
    if attempt >= max_attempts:
        return Decision(Action.DO_NOT_RETRY, 0.0, Why.ATTEMPTS)
    parsed = parse_retry_after(retry_after, now)
    delay_s = min(DEFAULT_DELAY_S if parsed is None else parsed, MAX_DELAY_S)
    if elapsed_s + delay_s > deadline_s:
        return Decision(Action.DO_NOT_RETRY, 0.0, Why.DEADLINE)
    return Decision(action, delay_s, Why.TABLE)


def settled_by_receipt(tool: str, failure: FailureKind | str) -> bool:
    """After a ``do_not_retry`` of a call that may have been received (anything but
    ``connect_error``) of a tool that is never resent (``exec``): look its key up, and
    answer from its outcome if there is one; never send it again."""
    spec = TOOLS.get(tool)
    kind = _failure_kind(failure)
    return (
        spec is not None
        and spec.retry_class is RetryClass.EXEC
        and kind is not FailureKind.CONNECT_ERROR
    )


def table_rows() -> list[dict[str, str | bool]]:
    """One row per tool and failure kind: what ``slotrunner tools table --json`` prints."""
    return [
        {
            "tool": name,
            "mutating": spec.mutating,
            "failure": kind.value,
            "decision": TABLE[spec.retry_class][kind].value,
        }
        for name, spec in TOOLS.items()
        for kind in FailureKind
    ]


def format_table() -> str:
    """The table for humans: one line per tool, one column per failure kind."""
    header = ["tool", "mutating", *(kind.value for kind in FailureKind)]
    lines = [
        [
            name,
            "yes" if spec.mutating else "no",
            *(TABLE[spec.retry_class][kind].value for kind in FailureKind),
        ]
        for name, spec in TOOLS.items()
    ]
    lines.append(["(unknown tool)", "-", *(Action.DO_NOT_RETRY.value for _ in FailureKind)])
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *lines]
    )


def _failure_kind(failure: FailureKind | str) -> FailureKind:
    try:
        return FailureKind(failure)
    except ValueError:
        known = ", ".join(kind.value for kind in FailureKind)
        raise ValueError(f"unknown failure kind {failure!r} (known: {known})") from None
