"""The OpenAI-compatible planner: chat completions with tool calling, fenced by admission.

Every request holds an admission lease of the job's eval-run (``runner.admission.desk``),
so in-flight inference stays within the run's bound across every worker (I6). A
local timeout does not cancel the request on the server: it *expires* the lease, and
when the late body arrives it re-enters the desk, is rejected as stale, and never
becomes a tool call (docs/architecture.md §Admission). A 429 gives the capacity back
and re-acquires it: no retry sneaks around the counter. Empty or schema-invalid bodies are protocol
errors, counted apart from transport failures. :func:`admission_desk` builds the
run's desk for a planner spec: its recovery hold after a Redis loss lasts as long as
one of its requests can stay out (the HTTP timeout, not the local one: a timed-out
request keeps its lease until its late body arrives).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import AdmissionRefused, Lease, StaleCompletion
from runner.agent import openai_wire as wire
from runner.errors import RunnerError
from runner.jobs.models import OpenAIPlanner, Step, StepRecord
from tools import classifier, registry

MAX_REQUESTS_PER_STEP = 8
STOP_POLL_S = 0.2  # how often a wait for the model checks for a cancel
RESULT_CHARS = 4000
# Beyond the HTTP timeout, how long a finished request may take to give its lease back.
RECOVERY_GRACE_S = 30.0


class PlannerError(RunnerError):
    """The planner could not get a usable completion for a step."""


class PlannerStopped(PlannerError):
    """The job was told to stop (cancelled, superseded) while a request was in flight."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped while waiting for the model: {reason}")
        self.reason = reason


def tool_schemas() -> list[dict[str, Any]]:
    """The registry's tools as OpenAI function definitions."""
    return [
        wire.function_tool(
            spec.name,
            f"slotrunner tool {spec.name}"
            + (" (changes the work tree)" if spec.mutating else " (read-only)"),
            spec.args_model.model_json_schema(),
        )
        for spec in registry.TOOLS.values()
    ]


def step_number(job_id: str, attempt: int, index: int) -> int:
    """A desk step id unique to (job, attempt, step): the desk's steps are per eval-run."""
    digest = hashlib.blake2b(f"{job_id}:{attempt}:{index}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def http_timeout_s(spec: OpenAIPlanner) -> float:
    """How long one request may stay out: a timed-out one is left to answer late."""
    return max(spec.request_timeout_s * 20, 60.0)


def admission_desk(
    redis_client: redis.Redis,
    spec: OpenAIPlanner,
    eval_run: str,
    *,
    home: Path | None = None,
    recovery_hold_s: float | None = None,
) -> AdmissionDesk:
    """The eval-run's desk for this planner: witnessed under ``home`` when given, held
    after a Redis loss for ``recovery_hold_s`` (default: the longest a request of
    ``spec`` can stay out, plus a grace)."""
    if recovery_hold_s is None:
        recovery_hold_s = http_timeout_s(spec) + RECOVERY_GRACE_S
    return AdmissionDesk(
        redis_client,
        eval_run,
        spec.admission_bound,
        home=home,
        recovery_hold_s=recovery_hold_s,
    )


class ChatPlanner:
    """Asks the model for the next tool call, one admission lease per request."""

    def __init__(
        self,
        spec: OpenAIPlanner,
        desk: AdmissionDesk,
        *,
        job_id: str,
        attempt: int,
        deadline_s: float,
        http: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        should_stop: Callable[[], str | None] | None = None,
    ) -> None:
        self.spec = spec
        self.should_stop = should_stop
        self.desk = desk
        self.job_id = job_id
        self.attempt = attempt
        self.clock = clock
        self.sleep = sleep
        self.ends_at = clock() + deadline_s
        headers = {}
        if spec.api_key_env and os.environ.get(spec.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[spec.api_key_env]}"
        self.http = http or httpx.Client(
            base_url=spec.base_url.rstrip("/"),
            headers=headers,
            transport=httpx.HTTPTransport(retries=0),
        )
        # Requests run on their own threads so a timed-out one can finish late and be
        # fenced at the desk, as a real backend would let it.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="inference")
        self.stats: Counter[str] = Counter()
        self.messages: list[dict[str, Any]] = [wire.user_message(spec.prompt)]
        self._pending: list[tuple[wire.ToolCall, Step]] = []
        self.final: str | None = None

    # -- the Planner protocol -----------------------------------------------------

    def steps(self) -> Iterator[Step]:
        index = 0
        while True:
            completion = self._complete(index)
            message = completion.choices[0].message
            calls = message.tool_calls or []
            if not calls:
                self.final = message.content or ""
                return
            self.messages.append(wire.assistant_message(message.content, calls))
            for call in calls:
                step = self._to_step(call)
                self._pending.append((call, step))
                yield step
            index += 1

    def observe(self, record: StepRecord) -> None:
        call, _ = self._pending.pop(0)
        payload = {"outcome": record.outcome, "detail": record.detail, "result": record.result}
        text = json.dumps(payload, default=str)[:RESULT_CHARS]
        self.messages.append(wire.tool_message(call.id, text))

    def close(self, *, wait: bool = False) -> None:
        """Stop taking requests; ``wait``: also until the ones still out have answered
        and been judged (their late bodies fenced at the desk), as a test wants."""
        self._pool.shutdown(wait=wait)

    # -- one step ---------------------------------------------------------------------

    def _to_step(self, call: wire.ToolCall) -> Step:
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            self.stats["protocol_errors"] += 1
            raise PlannerError(f"tool call {call.function.name}: arguments are not JSON") from None
        if not isinstance(args, dict):
            raise PlannerError(f"tool call {call.function.name}: arguments are not an object")
        return Step(tool=call.function.name, args=args)

    def _remaining_s(self) -> float:
        return self.ends_at - self.clock()

    def _complete(self, index: int) -> wire.ChatCompletion:
        step = step_number(self.job_id, self.attempt, index)
        body = wire.chat_request(
            self.spec.model,
            list(self.messages),
            tools=tool_schemas(),
            temperature=self.spec.temperature,
        )
        failures = 0
        # 429s are bounded by the deadline (the endpoint said "later", not "no");
        # every other failed request counts against MAX_REQUESTS_PER_STEP.
        while failures < MAX_REQUESTS_PER_STEP:
            if self._remaining_s() <= 0:
                break
            try:
                lease = self.desk.acquire(step, deadline_s=max(self._remaining_s(), 0.0))
            except AdmissionRefused as exc:
                self.stats["admission_refused"] += 1
                raise PlannerError(f"admission refused: {exc}") from None
            self.stats["requests"] += 1
            future = self._pool.submit(self._post, body)
            try:
                status, headers, raw = self._wait(future, lease)
            except FutureTimeout:
                # The request is not cancelled (the backend may still answer): fence it.
                self.desk.expire(lease)
                self.stats["timeouts"] += 1
                future.add_done_callback(functools.partial(self._late, lease=lease))
                failures += 1
                continue
            except httpx.HTTPError:
                self.desk.release(lease)
                self.stats["transport_errors"] += 1
                self.sleep(min(0.5, max(self._remaining_s(), 0)))
                failures += 1
                continue
            completion = self._settle(lease, status, headers, raw)
            if completion is not None:
                return completion
            if status != 429:
                failures += 1
        raise PlannerError(
            f"step {index}: no usable completion within the deadline or "
            f"{MAX_REQUESTS_PER_STEP} requests"
        )

    def _wait(
        self, future: Future[tuple[int, httpx.Headers, bytes]], lease: Lease
    ) -> tuple[int, httpx.Headers, bytes]:
        """The request's answer; FutureTimeout past the local timeout; PlannerStopped
        when the job is cancelled or superseded meanwhile (docs/architecture.md §Admission:
        the lease is marked cancel_requested and stays counted until the backend
        confirms it is done)."""
        give_up = self.clock() + self.spec.request_timeout_s
        while True:
            left = give_up - self.clock()
            if left <= 0:
                raise FutureTimeout
            try:
                return future.result(timeout=min(STOP_POLL_S, left))
            except FutureTimeout:
                stop = self.should_stop() if self.should_stop is not None else None
                if stop is None:
                    continue
                self.desk.cancel(lease)
                self.stats["cancelled_in_flight"] += 1
                future.add_done_callback(functools.partial(self._abandoned, lease=lease))
                raise PlannerStopped(stop) from None

    def _abandoned(self, future: Future[tuple[int, httpx.Headers, bytes]], *, lease: Lease) -> None:
        """A request whose job stopped has answered: the capacity comes back now."""
        self.desk.release(lease)
        self.stats["confirmed_releases"] += 1

    def _settle(
        self, lease: Lease, status: int, headers: httpx.Headers, raw: bytes
    ) -> wire.ChatCompletion | None:
        if status == 429:
            self.desk.release(lease)
            self.stats["http_429"] += 1
            wait = classifier.parse_retry_after(headers.get("retry-after"), datetime.now(UTC))
            # Never a tight loop, even on "Retry-After: 0".
            delay = max(wait if wait is not None else 1.0, 0.05)
            self.sleep(min(delay, max(self._remaining_s(), 0)))
            return None
        if status >= 400:
            self.desk.release(lease)
            self.stats[f"http_{status // 100}xx"] += 1
            return None
        try:
            completion = wire.parse_completion(raw)
        except ValueError:
            self.desk.release(lease)
            self.stats["protocol_errors"] += 1
            return None
        try:
            committed = self.desk.apply(lease)
        except StaleCompletion:
            self.stats["stale_rejections"] += 1
            self.desk.release(lease)
            return None
        self.desk.release(lease)
        if not committed:
            self.stats["duplicate_completions"] += 1
            return None
        self.stats["commits"] += 1
        return completion

    def _late(self, future: Future[tuple[int, httpx.Headers, bytes]], *, lease: Lease) -> None:
        """A timed-out request answered after all: its body must never become a step."""
        try:
            future.result()
            self.stats["late_bodies"] += 1
            self.desk.apply(lease)
            self.stats["stale_commits_BUG"] += 1  # unreachable while the desk holds
        except StaleCompletion:
            self.stats["stale_rejections"] += 1
        except Exception:
            self.stats["late_failures"] += 1
        finally:
            # The backend is done with it: only now does the capacity come back (I7).
            self.desk.release(lease)

    def _post(self, body: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        response = self.http.post(wire.ROUTE, json=body, timeout=http_timeout_s(self.spec))
        return response.status_code, response.headers, response.content
