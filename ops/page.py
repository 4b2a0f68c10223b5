"""Page an operator: post each incident to a webhook once, across restarts.

Wire shape: the body of Alertmanager's ``POST /api/v2/alerts``, a JSON list of
``{"labels", "annotations", "startsAt"}`` objects, so ``--webhook`` can point straight
at an Alertmanager (``http://am:9093/api/v2/alerts``) or at any receiver that takes
its alerts. (Not the "version 4" webhook: that is what Alertmanager sends onwards.)
Every label value is a string; ``incident`` carries the dedup key, so two incidents
are two alerts and a re-post of one incident is the same alert.

Once each: an incident's identity is :attr:`Incident.dedup_key` (no path in it, so
a line re-read after rotation is the same incident). Alerts are appended, fsynced,
to ``outbox.jsonl`` before delivery and their keys to ``sent.jsonl`` once the
receiver answered 2xx. A restart re-sends only what was never acknowledged. The one
window left, a crash between the receiver's 2xx and the fsync of ``sent.jsonl``,
re-posts an alert with identical labels, which Alertmanager folds into the alert it
already has instead of notifying twice.

Delivery is retried with stamina (exponential backoff with jitter, capped in attempts
and in total time) on connection errors, 5xx and 429 (honouring ``Retry-After``).
Another 4xx is a configuration error and is not retried. What could not be delivered
stays pending and goes out with the next delivery.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import stamina

from ops.detect.detector import Incident
from ops.errors import OpsError
from runner.core.durable import append_record

BATCH = 64  # alerts per request
MAX_RETRY_AFTER_S = 30.0


class PageError(OpsError):
    """Alerts could not be delivered; they stay queued for the next attempt."""


def alert(incident: Incident, note: str | None = None) -> dict[str, Any]:
    """One incident as an Alertmanager alert."""
    i = incident
    annotations = {
        "summary": f"{i.kind} on {i.host}/{i.slot_id} generation {i.generation}: "
        f"job {i.job_id} {i.tool} key {i.idempotency_key}",
        "description": f"{i.path}:{i.line} at {i.ts}",
        "idempotency_key": i.idempotency_key,
    }
    if note:
        annotations["pool"] = note
    labels = {
        "alertname": f"slotrunner_{i.kind}",
        "severity": "page",
        "kind": i.kind,
        "host": i.host,
        "slot_id": i.slot_id,
        "generation": str(i.generation),
        "job_id": i.job_id,
        "tool": i.tool,
        "incident": i.dedup_key,
    }
    return {"labels": labels, "annotations": annotations, "startsAt": i.ts}


def _retry_on(exc: BaseException) -> bool | float:
    """stamina's hook: retry what may pass next time; a float is the delay to use."""
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status == 429:
            try:
                return min(max(float(exc.response.headers["Retry-After"]), 0.0), MAX_RETRY_AFTER_S)
            except (KeyError, ValueError):
                return True
        return status >= 500
    return False


class Pager:
    """A webhook and the durable record of what was queued and what was acknowledged."""

    def __init__(
        self,
        url: str,
        state_dir: Path,
        *,
        attempts: int = 6,
        timeout_s: float = 20.0,
        wait_max_s: float = 2.0,
        request_timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self._attempts, self._timeout_s, self._wait_max_s = attempts, timeout_s, wait_max_s
        state_dir.mkdir(parents=True, exist_ok=True)
        self._outbox, self._sent_log = state_dir / "outbox.jsonl", state_dir / "sent.jsonl"
        self._sent = {r["id"] for r in _records(self._sent_log)}
        self._known = set(self._sent)
        self._pending: dict[str, dict[str, Any]] = {}
        for r in _records(self._outbox):
            self._known.add(r["id"])
            if r["id"] not in self._sent:
                self._pending[r["id"]] = r["alert"]
        self._client = httpx.Client(timeout=request_timeout_s)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enqueue(self, incidents: Iterable[Incident], note: str | None = None) -> int:
        """Queue the incidents never queued before (durably); how many were new."""
        fresh = {}
        for incident in incidents:
            key = incident.dedup_key
            if key not in self._known and key not in fresh:
                fresh[key] = alert(incident, note)
        if fresh:
            lines = "".join(json.dumps({"id": k, "alert": a}) + "\n" for k, a in fresh.items())
            append_record(self._outbox, lines.encode())
            self._known.update(fresh)
            self._pending.update(fresh)
        return len(fresh)

    def deliver(self) -> int:
        """Post every pending alert; how many were delivered. Raises PageError (the
        undelivered stay pending) when the receiver stays down or refuses them."""
        delivered = 0
        while self._pending:
            batch = dict(list(self._pending.items())[:BATCH])
            try:
                self._post(list(batch.values()))
            except httpx.HTTPError as exc:
                raise PageError(f"could not page {self.url}: {_describe(exc)}") from exc
            lines = "".join(json.dumps({"id": k}) + "\n" for k in batch)
            append_record(self._sent_log, lines.encode())
            for key in batch:
                del self._pending[key]
                self._sent.add(key)
            delivered += len(batch)
        return delivered

    def page(self, incidents: Iterable[Incident], note: str | None = None) -> int:
        """Queue, then deliver everything pending."""
        self.enqueue(incidents, note)
        return self.deliver()

    def _post(self, alerts: list[dict[str, Any]]) -> None:
        retrying = stamina.retry_context(
            on=_retry_on,
            attempts=self._attempts,
            timeout=self._timeout_s,
            wait_initial=0.1,
            wait_max=self._wait_max_s,
            wait_jitter=0.1,
        )
        for attempt in retrying:
            with attempt:
                self._client.post(self.url, json=alerts).raise_for_status()

    def close(self) -> None:
        self._client.close()


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return f"{type(exc).__name__}: {exc}"


def _records(path: Path) -> list[dict[str, Any]]:
    """The records of one of our JSONL files; a torn last line (a crash mid-append) is absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    if data and not data.endswith(b"\n"):
        # End the torn line, or the next append would be glued to it and lost with it.
        append_record(path, b"\n")
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "id" in record:
            out.append(record)
    return out
