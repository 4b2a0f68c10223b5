"""The worker's side of a tool call: envelope check, retry classifier, then HTTP.

Nothing is sent whose envelope the local stamp already refuses. Every transport
failure is classified (``tools.classifier``) before anything is retried, and the
retry loop is stamina's, driven by the classifier's decision; the classifier is
the only place that says *whether* to retry. A mutating call whose outcome is
unknown is resolved by reading its receipt (``reconcile``), never by replaying it
blindly; a resend happens only when the receipt store proves it never applied and
the lease is still live, and it carries the same key, so the server keeps it at
most once; an ``exec`` is never resent once sent, only looked up. The errors
(:class:`ToolCallError` and its four kinds) are drawn in ``tools.errors``; each
carries a :class:`tools.reasons.Reason`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import stamina

from runner.core.stamp import StampError, read_stamp, utc_now
from tools import classifier, registry
from tools.classifier import Action, FailureKind
from tools.envelope import Envelope, check
from tools.errors import ToolError
from tools.reasons import Reason

# Tells the server which classifier decision a resend came from (its retry metrics).
RETRY_HEADER = "x-slotrunner-retry"
# The calling process, on every request: the chaos campaign's fault proxy kills or
# pauses exactly the worker child that made a call (``ops.testing.fault_proxy``).
PID_HEADER = "x-slotrunner-pid"
# What a URL path segment may hold unquoted (RFC 3986 pchar, but "%"), so a readable key
# such as job-A:1:3:write_file is sent as it reads.
_PATH_SEGMENT_SAFE = "-._~!$&'()*+,;=:@"


class ToolCallError(ToolError):
    """Base of the client's errors: ``status`` is the HTTP status, when there was one."""

    def __init__(
        self, message: str, reason: Reason | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, reason)
        self.status = status


class StaleEnvelope(ToolCallError):
    """Refused locally by the slot's stamp; nothing was sent (I1)."""


class ToolRefused(ToolCallError):
    """The server said no. ``error`` is its body's reason as sent: a value of
    :class:`Reason` (then also ``reason``), or text it does not name (``refused``)."""

    reason = Reason.REFUSED

    def __init__(self, message: str, error: str | None = None, status: int | None = None) -> None:
        try:
            named = Reason(error) if error is not None else None
        except ValueError:
            named = None
        super().__init__(message, named, status)
        self.error = error if error is not None else self.reason.value


class OutcomeUnknown(ToolCallError):
    """Sent, not answered, and the receipt store could not tell what happened."""

    reason = Reason.OUTCOME_UNKNOWN


class TransportFailed(ToolCallError):
    """Not sent or not answered, and not retried further; ``failure`` says how."""

    reason = Reason.TRANSPORT_FAILED

    def __init__(self, message: str, failure: FailureKind | None = None) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass(frozen=True)
class ToolResponse:
    result: dict[str, Any]
    receipt: dict[str, Any] | None
    replayed: bool
    reconciled: bool = False


class _Failure(Exception):
    """One attempt's failure, with the classifier's decision attached."""

    def __init__(self, kind: FailureKind, decision: classifier.Decision, detail: str) -> None:
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.decision = decision


_RETRYING = {Action.RETRY_AFTER_HEADER, Action.RETRY_ONCE, Action.RETRY_ONLY_WITH_RECEIPT}


class ToolClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        headers = {"x-slotrunner-token": token} if token else {}
        # Transport retries off: the classifier decides every retry, never httpx.
        self.http = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=timeout_s,
            transport=transport or httpx.HTTPTransport(retries=0),
            event_hooks={"request": [_stamp_pid]},
        )
        self.clock = clock
        self.decisions: Counter[str] = Counter()
        self._last_decision = ""

    def close(self) -> None:
        self.http.close()

    # -- one call ---------------------------------------------------------------

    def call(
        self,
        envelope: Envelope,
        args: dict[str, Any],
        *,
        slot_dir: Path | None = None,
        deadline_s: float = 300.0,
    ) -> ToolResponse:
        spec = registry.get(envelope.tool)
        mutating = spec.mutating if spec is not None else True
        self._check_local(envelope, slot_dir, mutating)
        started = time.monotonic()
        body = {"envelope": envelope.model_dump(), "args": args}
        attempt = 0

        def hook(exc: BaseException) -> bool | float:
            if isinstance(exc, _Failure) and exc.decision.action in _RETRYING:
                self.decisions[exc.decision.action.value] += 1
                self._last_decision = exc.decision.action.value
                return exc.decision.delay_s
            return False

        try:
            for retry in stamina.retry_context(
                on=hook,
                # The classifier stops at the same count; this cap only backs it up.
                attempts=classifier.MAX_ATTEMPTS,
                timeout=deadline_s,
                wait_initial=classifier.CALL_BACKOFF.initial_s,
                wait_max=classifier.CALL_BACKOFF.max_s,
                wait_jitter=classifier.CALL_BACKOFF.jitter_s,
            ):
                with retry:
                    attempt += 1
                    # The same key and envelope on every attempt: only this call is
                    # ever resent, never some other buffered request
                    # (docs/architecture.md §Problem).
                    if attempt > 1:
                        self._check_local(envelope, slot_dir, mutating)
                    return self._attempt(envelope, body, slot_dir, attempt, started, deadline_s)
        except _Failure as exc:
            self.decisions[exc.decision.action.value] += 1
            settle = classifier.settled_by_receipt(envelope.tool, exc.kind)
            if exc.decision.action == Action.RECONCILE or settle:
                return self._reconcile(
                    envelope, body, slot_dir, started, deadline_s, exc, resend=not settle
                )
            raise TransportFailed(
                f"{envelope.tool} failed: {exc} ({exc.decision.reason})", exc.kind
            ) from None
        raise TransportFailed(f"{envelope.tool}: no attempt was made")  # pragma: no cover

    def _check_local(self, envelope: Envelope, slot_dir: Path | None, mutating: bool) -> None:
        if slot_dir is None:
            return
        try:
            stamp = read_stamp(slot_dir)
        except StampError as exc:
            raise StaleEnvelope(str(exc), Reason.SLOT_JOB_MISMATCH) from None
        if stamp is None:
            raise StaleEnvelope(f"{slot_dir} has no stamp", Reason.SLOT_JOB_MISMATCH)
        reason = check(stamp, envelope, mutating=mutating, now=self.clock())
        if reason is not None:
            raise StaleEnvelope(f"refused before sending: {reason.value}", reason)

    def _attempt(
        self,
        envelope: Envelope,
        body: dict[str, Any],
        slot_dir: Path | None,
        attempt: int,
        started: float,
        deadline_s: float,
    ) -> ToolResponse:
        tool = envelope.tool
        try:
            headers = {RETRY_HEADER: self._last_decision} if attempt > 1 else None
            wait = registry.reply_timeout_s(tool, body["args"]) or httpx.USE_CLIENT_DEFAULT
            response = self.http.post(f"/v1/tools/{tool}", json=body, headers=headers, timeout=wait)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._failure(
                tool, FailureKind.CONNECT_ERROR, attempt, started, deadline_s, None, exc
            ) from exc
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
            raise self._failure(
                tool, FailureKind.READ_TIMEOUT, attempt, started, deadline_s, None, exc
            ) from exc
        except httpx.TransportError as exc:
            raise self._failure(
                tool, FailureKind.CONNECTION_LOST, attempt, started, deadline_s, None, exc
            ) from exc
        if response.status_code == 429:
            failure = self._failure(
                tool,
                FailureKind.HTTP_429,
                attempt,
                started,
                deadline_s,
                response.headers.get("retry-after"),
                response.text,
            )
            if (
                failure.decision.action == Action.RETRY_ONLY_WITH_RECEIPT
                and envelope.idempotency_key
            ):
                found = self._lookup(envelope)
                if found is not None:
                    return found
            raise failure
        if response.status_code >= 500:
            raise self._failure(
                tool, FailureKind.HTTP_5XX, attempt, started, deadline_s, None, response.text
            )
        return _decode(response)

    def _failure(
        self,
        tool: str,
        kind: FailureKind,
        attempt: int,
        started: float,
        deadline_s: float,
        retry_after: str | None,
        detail: object,
    ) -> _Failure:
        decision = classifier.classify(
            tool,
            kind,
            attempt=attempt,
            elapsed_s=time.monotonic() - started,
            deadline_s=deadline_s,
            retry_after=retry_after,
            now=self.clock(),
        )
        return _Failure(kind, decision, str(detail)[:300])

    # -- outcome unknown --------------------------------------------------------

    def _lookup(self, envelope: Envelope) -> ToolResponse | None:
        # Quoted as one path segment: a key may hold "/", "?", "#" or "%" (any text).
        key = quote(envelope.idempotency_key or "", safe=_PATH_SEGMENT_SAFE)
        response = self.http.get(f"/v1/receipts/{key}", params={"slot": envelope.slot_id})
        if response.status_code == 200:
            receipt = response.json()["receipt"]
            return ToolResponse(
                receipt.get("result") or {}, receipt, replayed=True, reconciled=True
            )
        if response.status_code == 404:
            return None
        raise OutcomeUnknown(
            f"receipt lookup answered {response.status_code}{_why(response)}",
            status=response.status_code,
        )

    def _reconcile(
        self,
        envelope: Envelope,
        body: dict[str, Any],
        slot_dir: Path | None,
        started: float,
        deadline_s: float,
        failure: _Failure,
        *,
        resend: bool = True,
    ) -> ToolResponse:
        """Sent, no answer: ask the receipt store; resend only what provably never applied.

        Runs until the deadline: the server may be restarting (a crash between intent
        and outcome), and its receipt store is the only authority on what happened.
        Without ``resend`` (``exec``) only an outcome on record settles it (a command
        still running holds the slot lock, so its lookup answers once it has ended).
        """
        if not envelope.idempotency_key:
            raise OutcomeUnknown(f"{envelope.tool}: {failure} and the call has no idempotency key")
        remaining = deadline_s - (time.monotonic() - started)
        backoff = classifier.RECONCILE_BACKOFF
        resends = 0

        def hook(exc: BaseException) -> bool | float:
            if isinstance(exc, _Unsettled):
                return exc.delay_s
            return isinstance(exc, httpx.TransportError)

        try:
            for retry in stamina.retry_context(
                on=hook, attempts=None, timeout=max(remaining, 0.001),
                wait_initial=backoff.initial_s, wait_max=backoff.max_s,
                wait_jitter=backoff.jitter_s,
            ):  # fmt: skip
                with retry:
                    found = self._lookup(envelope)
                    if found is not None:
                        return found
                    if not resend or resends >= classifier.MAX_RESENDS:
                        break
                    # Absent: it never applied. Resend the same key, only while our
                    # lease is live; the server's put-if-absent keeps it at most once.
                    self._check_local(envelope, slot_dir, True)
                    resends += 1
                    self.decisions["resend_after_reconcile"] += 1
                    response = self.http.post(
                        f"/v1/tools/{envelope.tool}", json=body,
                        headers={RETRY_HEADER: Action.RECONCILE.value},
                    )  # fmt: skip
                    if response.status_code == 429:
                        wait = classifier.parse_retry_after(
                            response.headers.get("retry-after"), self.clock()
                        )
                        raise _Unsettled(wait if wait is not None else classifier.DEFAULT_DELAY_S)
                    if response.status_code >= 500:
                        raise _Unsettled(classifier.RESEND_5XX_DELAY_S)
                    return _decode(response)
        except (httpx.TransportError, _Unsettled):
            pass
        why = "the receipt store could not settle it before the deadline"
        if not resend:
            why = "not resent, and the receipt store holds no outcome for it"
        raise OutcomeUnknown(f"{envelope.tool} ({envelope.idempotency_key}): {failure}; {why}")


def _stamp_pid(request: httpx.Request) -> None:
    # At send time, not at construction: a client built before a fork names the child.
    request.headers[PID_HEADER] = str(os.getpid())


class _Unsettled(Exception):
    """A resend after reconcile was answered 429/5xx: look again after a delay."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(f"unsettled, retry in {delay_s:.2f}s")
        self.delay_s = delay_s


def _decode(response: httpx.Response) -> ToolResponse:
    try:
        data = response.json()
    except ValueError:
        raise ToolRefused(
            f"HTTP {response.status_code} with a body that is not JSON", status=response.status_code
        ) from None
    if response.status_code == 200:
        return ToolResponse(
            data.get("result") or {}, data.get("receipt"), bool(data.get("replayed"))
        )
    reason = data.get("error", "refused") if isinstance(data, dict) else "refused"
    message = data.get("message", reason) if isinstance(data, dict) else str(data)
    raise ToolRefused(
        f"HTTP {response.status_code} {reason}: {message}", str(reason), response.status_code
    )


def _why(response: httpx.Response) -> str:
    """``": <error>: <message>"`` from a JSON error body, or nothing."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    parts = [str(body[k])[:200] for k in ("error", "message") if body.get(k)]
    return ": " + ": ".join(parts) if parts else ""
