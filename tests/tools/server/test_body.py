"""A call's body as the server decodes and validates it (tools/server/body.py, the
service's models): absurd nesting, wrong JSON types and a job id with a newline are
422 malformed, never a 500 or a traceback (#15)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.execslots import Slots, envelope
from tests.support.toolserver import ToolServer
from tools.server.body import MAX_JSON_DEPTH, decode, deeper_than


def nested(levels: int) -> Any:
    """``levels`` arrays, one inside the other."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("levels", [1, 2, MAX_JSON_DEPTH])
def test_a_body_within_the_depth_is_decoded(levels: int) -> None:
    """Brackets inside strings do not nest (they only make the decoder look)."""
    body = json.dumps([nested(levels - 1) if levels > 1 else 0, "[{" * 100]).encode()
    payload, problem = decode(body)
    assert problem is None and payload[1] == "[{" * 100


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 5000])
def test_a_body_past_the_depth_is_refused(levels: int) -> None:
    payload, problem = decode(b"[" * levels + b"]" * levels)
    assert payload is None and problem is not None and f"{MAX_JSON_DEPTH} levels" in problem


def test_the_depth_counts_objects_and_arrays_alike() -> None:
    value: Any = 1
    for level in range(MAX_JSON_DEPTH):
        value = {"k": value} if level % 2 else [value]
    assert not deeper_than(value, MAX_JSON_DEPTH)
    assert deeper_than({"wrap": value}, MAX_JSON_DEPTH)


def server_out(toolserver: ToolServer) -> str:
    return (toolserver.log_dir / "toolserver.out").read_text()


DEEP_BODIES = [
    b"[" * 100_000 + b"]" * 100_000,  # 200 KB of brackets, the body
    b'{"envelope":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}",
    b'{"envelope": {}, "args": ' + b"[" * 40 + b"]" * 40 + b"}",
]


def test_deep_nesting_is_malformed_without_a_traceback(toolserver: ToolServer) -> None:
    """422 malformed naming the nesting; the server logs no RecursionError."""
    for body in DEEP_BODIES:
        response = httpx.post(
            f"{toolserver.url}/v1/tools/write_file",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "malformed"
        assert "nests arrays or objects" in response.json()["message"]
    assert "Traceback" not in server_out(toolserver)


def test_an_envelope_field_of_the_wrong_json_type_is_malformed(
    toolserver: ToolServer, slots: Slots
) -> None:
    """ "1" and true are not integers, and a job id ending in a newline is no job id
    (the rule of #11, tests/runner/core/test_ids.py): 422 naming the field. 1.0 is an
    integer, as JSON Schema has it."""
    stamp = slots.lease("job-A")
    url = f"{toolserver.url}/v1/tools/git_status"
    for field, value in [
        ("attempt", "1"),
        ("attempt", True),
        ("generation", 1.5),
        ("job_id", "abc\n"),
    ]:
        body = {"envelope": {**envelope(stamp, None, "git_status"), field: value}, "args": {}}
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == 422, (field, value, response.text)
        assert response.json()["error"] == "malformed" and field in response.json()["message"]
    integral = {"envelope": {**envelope(stamp, None, "git_status"), "attempt": 1.0}}
    assert httpx.post(url, json=integral, timeout=30).status_code == 200


def test_args_that_are_not_an_object_are_malformed(toolserver: ToolServer, slots: Slots) -> None:
    """Only a missing or null ``args`` means no arguments; [] or false is malformed."""
    stamp = slots.lease("job-A")
    url = f"{toolserver.url}/v1/tools/git_status"
    given = envelope(stamp, None, "git_status")
    not_objects: list[Any] = [[], False, 0, "", "{}"]
    for args in not_objects:
        response = httpx.post(url, json={"envelope": given, "args": args}, timeout=30)
        assert response.status_code == 422, (args, response.text)
        assert response.json()["error"] == "malformed"
    for absent in ({"envelope": given}, {"envelope": given, "args": None}):
        assert httpx.post(url, json=absent, timeout=30).status_code == 200
