"""schemathesis against a live tool server and the schema it publishes: every check passes.

A real ``slotrunner toolserver`` with a server token (so ``ignored_auth`` has something
to prove), the sandbox required (a generated ``exec`` command never runs unconfined)
and one slot leased with a job description, so valid envelopes exist. A hook gives
some of the valid generated requests the live lease, paths the tree has, or a key that
has a receipt, so calls reach the tools and the receipt store, not only the fence.
schemathesis's own engine (what ``schemathesis run`` drives) runs its coverage and
fuzzing phases with every check of ``tests/tools/server/schemathesis.toml``: status
codes, content types, bodies and headers against the schema, negative data rejected,
positive data accepted, auth enforced, no 5xx. The longer run is the command in
bench/README.md.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import schemathesis
import schemathesis.engine
from hypothesis import strategies as st
from schemathesis.engine import Status, events

from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools.builtin import write_job

CONFIG = Path(__file__).with_name("schemathesis.toml")
SERVER_TOKEN = "schemathesis-server-token"
AUTH = {"x-slotrunner-token": SERVER_TOKEN}
KNOWN_KEY = "schemathesis-known-key"
# Paths a tool can act on: files of the tree, a directory, one that does not exist yet.
TREE_PATHS = ("known.txt", "README", "pkg/lock.py", "pkg", "new/file.txt")
# Bounded so the run stays within the suite's budget (~15 s here); one seed and
# deterministic generation, so a failure is the same failure on every run.
EXAMPLES = 40
SEED = 15


@dataclass(frozen=True)
class Live:
    schema: Any
    log_path: Path  # the server's JSONL log
    server_out: Path  # its stdout and stderr


@pytest.fixture
def live(settings: Settings, tmp_path: Path, redis_url: str) -> Iterator[Live]:
    """The published schema of a live server with one leased slot, its hook attached."""
    served = settings.with_(token=SERVER_TOKEN, sandbox="required")
    server = ToolServer(served, tmp_path / "logs", SLOTRUNNER_TOKEN=SERVER_TOKEN)
    try:
        repo = tmp_path / "repo"
        base = make_repo(repo)
        pool = SlotPool(server.settings, redis.Redis.from_url(redis_url), EventLog(served))
        lease = pool.lease("job-A", 1)
        slot_dir = served.slots_dir / lease.slot_id
        Workspaces(served.home).prepare(slot_dir, str(repo), base, "job-A")
        job = {"job_id": "job-A", "generation": lease.generation, "test_command": ["true"]}
        write_job(slot_dir, {**job, "test_timeout_s": 10})
        envelope = {"job_id": "job-A", "attempt": 1, "slot_id": lease.slot_id}
        envelope["generation"] = lease.generation
        known = httpx.post(
            f"{server.url}/v1/tools/write_file",
            json={
                "envelope": {**envelope, "tool": "write_file", "idempotency_key": KNOWN_KEY},
                "args": {"path": "known.txt", "content": "known\n"},
            },
            headers=AUTH,
            timeout=30,
        )
        assert known.status_code == 200, known.text
        config = schemathesis.Config.from_path(CONFIG)
        config.update(seed=SEED, max_failures=None)
        project = config.projects.override  # where the CLI's own options go
        project.update(headers=AUTH, request_timeout=60)
        project.generation.update(max_examples=EXAMPLES, deterministic=True)
        schema = schemathesis.openapi.from_url(
            f"{server.url}/openapi.json", config=config, headers=AUTH, timeout=30
        )
        _reach_the_live_lease(schema, envelope, lease.slot_id)
        yield Live(schema, served.log_path, tmp_path / "logs" / "toolserver.out")
    finally:
        server.stop()


def _reach_the_live_lease(schema: Any, envelope: dict[str, Any], slot_id: str) -> None:
    """A hook giving two thirds of the valid generated requests the live lease: its
    envelope (with a fresh key), half of those with paths the tree has, or a key that has
    a receipt on its slot. Negative requests are left as generated, so they stay the
    invalid requests they are."""

    def live(case: Any, paths: tuple[str, str] | None) -> Any:
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("envelope"), dict):
            fresh = {"idempotency_key": f"st-{uuid.uuid4().hex}"}
            body = {**body, "envelope": {**body["envelope"], **envelope, **fresh}}
            args = body.get("args")
            if paths is not None and isinstance(args, dict):
                real = {"path": paths[0], "src": paths[0], "dst": paths[1]}
                body["args"] = {**args, **{k: v for k, v in real.items() if k in args}}
            case.body = body
        if "key" in (case.path_parameters or {}):
            case.path_parameters = {**case.path_parameters, "key": KNOWN_KEY}
            case.query = {**(case.query or {}), "slot": slot_id}
        return case

    def flatmap_case(context: Any, case: Any) -> Any:
        if case.meta is None or case.meta.generation.mode.is_negative:
            return st.just(case)
        paths = st.tuples(st.sampled_from(TREE_PATHS), st.sampled_from(TREE_PATHS))
        return st.one_of(
            st.just(case),
            st.just(None).map(lambda _: live(case, None)),
            paths.map(lambda chosen: live(case, chosen)),
        )

    schema.hook(flatmap_case)


def test_every_operation_passes_every_check(live: Live) -> None:
    """Every phase over every documented operation: each answer is documented, conforms
    to its schema, and none is a 5xx; calls reached the tools, and no traceback was logged."""
    problems: list[str] = []
    requests = 0
    for event in schemathesis.engine.from_schema(live.schema).execute():
        if isinstance(event, events.ScenarioFinished):
            requests += len(event.recorder.interactions)
            problems += _failures(event)
        elif isinstance(event, events.NonFatalError | events.FatalError):
            problems.append(f"{getattr(event, 'label', 'engine')}: {_error_of(event)}")
    assert not problems, "\n\n".join(problems)
    assert requests > 1000, f"only {requests} requests were sent"
    lines = [json.loads(line) for line in live.log_path.read_text().splitlines()]
    outcomes = Counter(line["outcome"] for line in lines if line["event"] == "tool_result")
    # The hook worked: tools ran under the live lease, not only refusals at the fence.
    assert outcomes["applied"] > 20 and outcomes["read"] > 10, outcomes
    assert "Traceback" not in live.server_out.read_text()


def _failures(event: events.ScenarioFinished) -> list[str]:
    if event.status not in (Status.FAILURE, Status.ERROR):
        return []
    found = []
    for checks in event.recorder.checks.values():
        for check in checks:
            if check.failure_info is not None:
                failure = check.failure_info.failure
                found.append(
                    f"{event.label}: {check.name}: {failure.title}\n{failure.message}\n"
                    f"{check.failure_info.code_sample}"
                )
    return found or [f"{event.label}: {event.status.value} (no failing check recorded)"]


def _error_of(event: events.NonFatalError | events.FatalError) -> str:
    error = event.value if isinstance(event, events.NonFatalError) else event.exception
    return f"{type(error).__name__}: {error}"
