"""Bad job specs at both doors (issue #15): `slotrunner submit` and the Celery task a
worker runs. A spec that cannot run is refused with a reason naming the field; nothing
is leased and nothing is left in Redis; never a traceback or an internal error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from runner.cli.main import main
from runner.core.settings import Settings
from runner.jobs import events as job_events
from runner.jobs.models import JobSpec
from runner.jobs.queue import TASK_NAME
from runner.jobs.submit import SpecError, parse_spec
from runner.worker.celery_app import create_app
from tests.support.fuzz import HOSTILE, JSON, STRINGS, fuzz_settings, nested, stderr_lines
from tests.support.stack import stack, wait_until

SCRIPTED = {"kind": "scripted", "steps": [{"tool": "git_status"}]}
BASE = {"job_id": "fuzz-1", "repo": "/nonexistent/repo", "planner": SCRIPTED}
MODEL = {"base_url": "http://127.0.0.1:1/v1"}
# Modules whose import does nothing (a python planner's entry is imported to check it).
ENTRIES = [
    "os.path:join",
    "os:getcwd",
    "json:loads",
    "zz_no_such_module:run",
    "os:no_such_function",
    "os:sep",
    "os:path:join",
    ":run",
    "os:",
    "1os:run",
    "os.:run",
    "os:run\n",
]


def _planners() -> st.SearchStrategy[Any]:
    """Planner blocks, most of them broken in one place."""
    value = JSON | HOSTILE
    scripted = st.fixed_dictionaries(
        {"kind": st.just("scripted")},
        optional={
            "steps": st.lists(
                st.fixed_dictionaries(
                    {"tool": st.sampled_from(["write_file", "", "x" * 65]) | STRINGS},
                    optional={"args": value, "extra": value},
                ),
                max_size=3,
            )
            | value,
        },
    )
    openai = st.fixed_dictionaries(
        {"kind": st.just("openai"), "base_url": st.just(MODEL["base_url"]) | value},
        optional={
            "model": st.just("m") | value,
            "prompt": st.just("p") | value,
            "api_key_env": st.sampled_from(["KEY", "A=B", "a\x00"]) | value,
            "request_timeout_s": value,
            "temperature": value,
            "admission_bound": st.sampled_from([0, 1, 4097]) | value,
        },
    )
    python = st.fixed_dictionaries(
        {"kind": st.just("python"), "entry": st.sampled_from(ENTRIES) | STRINGS},
        optional={"config": value | st.just(nested(100, {})), "model": _models()},
    )
    command = st.fixed_dictionaries(
        {
            "kind": st.just("command"),
            "argv": st.lists(st.sampled_from(["/bin/true", "true", "./run", "a\x00"]) | STRINGS)
            | value,
        },
        optional={
            "env": st.dictionaries(
                st.sampled_from(["A", "SLOTRUNNER_X", "OPENAI_API_KEY", "1A", "a b"]) | STRINGS,
                st.sampled_from(["v", "a\x00", "v" * 70_000]) | value,
                max_size=3,
            )
            | value,
            "model": _models(),
        },
    )
    kinds = st.sampled_from(["bogus", "", "Scripted", None, 1])
    return scripted | openai | python | command | st.fixed_dictionaries({"kind": kinds}) | value


def _models() -> st.SearchStrategy[Any]:
    value = JSON | HOSTILE
    return st.fixed_dictionaries(
        {"base_url": st.sampled_from([MODEL["base_url"], "ftp://x", "127.0.0.1:1"]) | value},
        optional={
            "api_key_env": st.sampled_from(["KEY", "", "A=B"]) | value,
            "request_timeout_s": value,
            "admission_bound": value,
            "admission_wait_s": value,
            "extra": value,
        },
    )


DEEP = nested(100, {})
# Values each field must refuse: wrong types, out of range, control characters, huge.
BAD: dict[str, list[Any]] = {
    "job_id": ["a" * 129, "a\n", "a\x00", "-a", "a..b", "a.lock", "", 7],
    "eval_run": ["", "e" * 129, 1],
    "repo": ["", "-x", "/x\n", "/x\x00", "r" * 5000, ["/x"]],
    "base": ["", "--upload-pack=x", "HEAD\n", "b" * 257, 1],
    "planner": [
        {"kind": "bogus"},
        {"kind": "scripted", "steps": []},
        {"kind": "scripted", "steps": [{"tool": ""}]},
        {"kind": "scripted", "steps": [{"tool": "x", "args": {"a": float("nan")}}]},
        {"kind": "scripted", "steps": [{"tool": "x", "args": DEEP}]},
        {"kind": "scripted", "steps": [{"tool": "x", "args": {"\ud800": 1}}]},
        {"kind": "openai", "base_url": "x", "model": "m", "prompt": "p"},
        {"kind": "openai", **MODEL, "model": "m", "prompt": "p", "temperature": float("nan")},
        {"kind": "openai", **MODEL, "model": "m", "prompt": "p", "request_timeout_s": 1e999},
        {"kind": "openai", **MODEL, "model": "m", "prompt": "p", "api_key_env": "a\x00"},
        {"kind": "python", "entry": ":run"},
        {"kind": "python", "entry": "os:getcwd"},
        {"kind": "python", "entry": "zz_no_such_module:run"},
        {"kind": "python", "entry": "os.path:join", "config": DEEP},
        {"kind": "python", "entry": "os.path:join", "model": {"base_url": "ftp://x"}},
        {"kind": "python", "entry": "os.path:join", "model": {**MODEL, "api_key_env": "A=B"}},
        {"kind": "command", "argv": ["./run"]},
        {"kind": "command", "argv": ["a\x00"]},
        {"kind": "command", "argv": []},
        {"kind": "command", "argv": ["true"], "env": {"SLOTRUNNER_X": "v"}},
        {"kind": "command", "argv": ["true"], "env": {"1A": "v"}},
        {"kind": "command", "argv": ["true"], "env": {"A": "a\x00"}},
        {"kind": "command", "argv": ["true"], "env": {"A": "\udcff"}},
        {"kind": "command", "argv": ["true"], "env": {"OPENAI_API_KEY": "k"}, "model": MODEL},
        {"kind": "command", "argv": ["true"], "env": {"A": 1}},
        "scripted",
        None,
    ],
    "test_command": [["a"] * 1025, ["a\x00"], [1], "ls", ["\ud800"]],
    "test_timeout_s": [0, -1, 3601, True, "5", float("inf")],
    "deadline_s": [0, 10**9, True, "600", float("nan")],
    "max_steps": [0, 10_001, True, "5", 1.0],
    "tools": [["nope"], ["\ud800"], [""], [], "read_file", [1]],
    "unknown_field": [1],
}
# The same fields with anything at all: refused or not, never a traceback.
ANY: dict[str, st.SearchStrategy[Any]] = {
    **{name: JSON | HOSTILE for name in BAD},
    "planner": _planners(),
    "test_command": st.lists(STRINGS, max_size=3),
}


@st.composite
def specs(draw: st.DrawFn) -> tuple[Any, str | None, bool]:
    """A spec, the top-level field it changed (None: the whole spec), and whether the
    change is one the spec must refuse."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([5, "x", None, True, [5]])), None, True
    field = draw(st.sampled_from(sorted(BAD)))
    spec = dict(BASE)
    if field in ("repo", "planner") and draw(st.integers(0, 9)) == 0:
        del spec[field]
        return spec, field, True
    bad = draw(st.booleans())
    spec[field] = draw(st.sampled_from(BAD[field]) if bad else ANY[field])
    return spec, field, bad


def _valid(spec: Any) -> bool:
    try:
        parse_spec(spec)
    except SpecError:
        return False
    return True


@pytest.fixture
def db15(settings: Settings) -> Iterator[tuple[Settings, redis.Redis]]:
    """This test's settings on database 15 of the session's Redis: a spec that turns out
    valid is enqueued where no worker of the suite listens."""
    url = (settings.redis_url or "").rsplit("/", 1)[0] + "/15"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        yield settings.with_(redis_url=url), client
    finally:
        client.close()


def _slots(settings: Settings) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(settings.slots_dir.glob("*/stamp.json"))}


def test_submit_refuses_bad_specs_and_names_the_field(
    db15: tuple[Settings, redis.Redis], tmp_path: Path
) -> None:
    """`slotrunner submit` over generated specs: exit 2 with one line naming the broken
    field and Redis untouched, or (for a spec that is in fact valid) exit 0."""
    settings, client = db15
    env = {**settings.to_env(), "REDIS_URL": settings.redis_url or ""}
    path = tmp_path / "spec.json"
    stamps = _slots(settings)

    @fuzz_settings(150)
    @given(case=specs(), as_list=st.booleans())
    def one(case: tuple[Any, str | None, bool], as_list: bool) -> None:
        spec, field, bad = case
        path.write_text(json.dumps([spec] if as_list else spec))
        before = set(client.keys("*"))
        result = CliRunner().invoke(main, ["submit", str(path)], env=env, prog_name="slotrunner")
        after = set(client.keys("*"))
        assert "Traceback" not in result.stderr, result.stderr
        if result.exit_code == 0:
            assert not bad and _valid(spec), spec
            client.delete(*(after - before))  # the job just enqueued, and its records
            return
        assert result.exit_code == 2, (result.exit_code, result.stderr)
        lines = stderr_lines(result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert after == before, after ^ before
        if field is not None and isinstance(spec, dict):
            assert field in lines[0] or "nests too deeply" in lines[0], (field, lines[0])

    one()
    assert _slots(settings) == stamps  # nothing leased


def test_non_json_spec_files(db15: tuple[Settings, redis.Redis], tmp_path: Path) -> None:
    """Bytes that are no JSON text, numbers past float, NaN, deep nesting: one line, exit 2."""
    settings, client = db15
    env = {**settings.to_env(), "REDIS_URL": settings.redis_url or ""}
    path = tmp_path / "spec.json"
    good = json.dumps(BASE)
    contents = st.binary(max_size=100) | st.sampled_from(
        [
            b"\xff\xfe" + good.encode("utf-16-le"),
            good.replace('"git_status"}', '"x", "args": {"a": NaN}}').encode(),
            good.replace('"git_status"}', '"x", "args": {"a": 1e999}}').encode(),
            good.replace('"fuzz-1"', "1" * 5000).encode(),
            good.replace('"git_status"', '"\\ud800"').encode(),
            b"[" * 100_000 + b"]" * 100_000,
            ('{"repo": "/x", "planner": ' + "[" * 50_000 + "]" * 50_000 + "}").encode(),
            b"[]",
            b"",
        ]
    )

    @fuzz_settings(40)
    @given(content=contents)
    def one(content: bytes) -> None:
        path.write_bytes(content)
        before = set(client.keys("*"))
        result = CliRunner().invoke(main, ["submit", str(path)], env=env, prog_name="slotrunner")
        assert result.exit_code == 2, (result.exit_code, result.stderr)
        lines = stderr_lines(result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert set(client.keys("*")) == before

    one()


def test_the_task_refuses_bad_specs_before_anything(
    db15: tuple[Settings, redis.Redis], tmp_path: Path
) -> None:
    """The task body, called as a worker calls it, over specs that fail validation:
    refused with a reason naming the field, logged as job_spec_refused; no key written
    and no slot leased."""
    import runner.worker.tasks  # noqa: F401  (a worker imports it at start: the app's include)

    settings, client = db15
    app = create_app(settings)
    task = app.tasks[TASK_NAME]
    stamps = _slots(settings)

    @fuzz_settings(100)
    @given(case=specs())
    def one(case: tuple[Any, str | None, bool]) -> None:
        spec, field, _ = case
        try:
            JobSpec.model_validate(spec)
        except ValidationError:
            pass
        else:
            assume(False)  # a valid spec would really run
        before = set(client.keys("*"))
        answer = task(spec)
        assert set(client.keys("*")) == before
        assert answer["state"] == "refused"
        assert answer["reason"].startswith("invalid job spec: ")
        if field is not None and isinstance(spec, dict):
            assert field in answer["reason"], (field, answer)
        logged = json.loads(settings.log_path.read_text().splitlines()[-1])
        assert logged["event"] == job_events.JOB_SPEC_REFUSED
        assert logged["reason"] == answer["reason"]

    one()
    assert _slots(settings) == stamps


def _refusals(events: list[dict[str, Any]], wanted: int) -> list[dict[str, Any]] | None:
    found = [e for e in events if e["event"] == job_events.JOB_SPEC_REFUSED]
    return found if len(found) >= wanted else None


def test_a_real_worker_refuses_bad_specs_and_runs_the_next_job(
    settings: Settings, tmp_path: Path
) -> None:
    """Bad specs sent straight to the queue (past submit): the worker logs each refusal,
    no traceback, no result or state for them, and serves the good job behind them."""
    bad = [
        {**BASE, "job_id": "bad-1", "max_steps": True},
        {**BASE, "job_id": "bad-2", "planner": {"kind": "bogus"}},
        {**BASE, "job_id": "bad\n3"},
        "not a spec",
    ]
    with stack(settings, tmp_path) as s:
        for spec in bad:
            s.app.send_task(TASK_NAME, args=[spec], queue="slotrunner")
        s.worker("w1")
        s.submit("good-1", [{"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}}])
        assert s.result("good-1").state == "succeeded"
        refused = wait_until("four refusals", lambda: _refusals(s.events(), 4))
        assert [e["job_id"] for e in refused] == ["bad-1", "bad-2", None, None]
        assert "max_steps" in refused[0]["reason"] and "planner" in refused[1]["reason"]
        for job_id in ("bad-1", "bad-2"):
            assert not s.redis.exists(f"slotrunner:job:{job_id}:state")
            assert not s.events("slot_leased", job_id=job_id)
        output = "".join(child.log_path.read_text(errors="replace") for child in s.workers)
        assert "Traceback" not in output, output[-3000:]
