"""MCP ``tools/call`` with arbitrary arguments (issue #15): a real tool server, a leased
slot, the official client. Every call is a normal result or an ``isError`` result whose
text starts with a reason code; never a JSON-RPC error, a 5xx or a traceback in the
server's log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.core import events
from runner.core.settings import Settings
from runner.slots.pool import Lease
from tests.support.execslots import Slots
from tests.support.fuzz import JSON, STRINGS, fuzz_settings
from tests.support.mcpclient import Mcp, mcp_session, text_of
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer
from tools import registry
from tools.builtin import write_job
from tools.reasons import Reason

PATCH = "--- a/README\n+++ b/README\n@@ -1 +1 @@\n-sample\n+fuzzed\n"
# One valid value per argument name, so a mutation of one field reaches the others' checks.
VALID = {
    "path": "notes.txt",
    "content": "x\n",
    "patch": PATCH,
    "src": "notes.txt",
    "dst": "moved.txt",
    "message": "fuzz",
    "command": "true",
    "timeout_s": 5,
}
CODES = {reason.value for reason in Reason} | {"tool_failed"}
# Paths of the test repo's tree that have broken tools before: the tree itself, a
# directory, a file used as a directory, git's own files.
PATHS = st.sampled_from([".", "./", "pkg", "pkg/", "README/", "README/x", ".git/HEAD", "notes.txt"])


def _valid(tool: str) -> dict[str, Any]:
    fields = registry.TOOLS[tool].args_model.model_fields
    return {name: VALID[name] for name in fields if name in VALID}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, Any, Any]:
    tool = draw(st.sampled_from([*registry.TOOLS, "nope", "", "../exec", "exec\n"]))
    fields = list(registry.TOOLS[tool].args_model.model_fields) if tool in registry.TOOLS else []
    known = st.sampled_from(fields) if fields else st.nothing()
    shape = draw(st.sampled_from(["strings", "one_field", "any"]))
    if tool in registry.TOOLS and shape == "strings":
        # Well-typed, hostile values: these reach the path checks and the effects.
        args = {
            name: draw(PATHS | STRINGS if name in ("path", "src", "dst") else STRINGS)
            if isinstance(v, str)
            else v
            for name, v in _valid(tool).items()
        }
    elif tool in registry.TOOLS and shape == "one_field":
        args = _valid(tool)  # one field changed, or one added
        args[draw(known | st.text(max_size=8))] = draw(JSON)
    else:
        args = draw(st.dictionaries(known | STRINGS, JSON, max_size=4))
    if isinstance(args.get("command"), str):
        # The command is really run: whatever follows, bash stops at the first line.
        args["command"] = "exit 0\n" + args["command"]
    # Mostly a good key (a few repeat, so replays happen) or none; sometimes anything.
    good = st.none() | st.text("abc-", min_size=1, max_size=6)
    key = draw(good if draw(st.integers(0, 3)) else STRINGS | JSON)
    return tool, args, key


@pytest.fixture
def leased(settings: Settings, tmp_path: Path) -> Iterator[tuple[ToolServer, Slots, Lease]]:
    server = ToolServer(settings, tmp_path / "logs")
    repo = tmp_path / "repo"
    slots = Slots(server.settings, repo, make_repo(repo))
    stamp = slots.lease("job-fuzz")
    assert isinstance(stamp, Lease)  # with its token and MCP URL
    write_job(
        slots.dir(stamp),
        {"job_id": "job-fuzz", "generation": stamp.generation, "test_command": ["true"]},
    )
    try:
        yield server, slots, stamp
    finally:
        slots.close()
        server.stop()


def _check(result: Any) -> None:
    text = text_of(result)
    if result.is_error:
        code = text.split(":", 1)[0]
        assert code in CODES, text
        # The door's catch-all: an exception the service did not expect is a bug.
        assert "failed inside the server" not in text, text
    else:
        body = result.structured_content
        assert set(body) == {"result", "receipt", "replayed"}, body


def _server_log_is_clean(server: ToolServer, settings: Settings) -> None:
    output = (server.log_dir / "toolserver.out").read_text(errors="replace")
    assert "Traceback" not in output and "ERROR" not in output, output[-3000:]
    lines = [json.loads(line) for line in settings.log_path.read_text().splitlines()]
    statuses = [line["http_status"] for line in lines if line["event"] == events.TOOL_RESULT]
    assert all(status < 500 for status in statuses), statuses


def test_arbitrary_arguments_get_a_result_or_a_reason(
    leased: tuple[ToolServer, Slots, Lease],
) -> None:
    """Every tool, arbitrary JSON arguments and idempotency keys, through the official
    client: a result, or isError with a reason code; the server logs no traceback."""
    server, _, stamp = leased
    assert stamp.token is not None

    with mcp_session(stamp.mcp_url, stamp.token) as mcp:

        @fuzz_settings(150)
        @given(call=calls())
        def one(call: tuple[str, Any, Any]) -> None:
            tool, args, key = call
            _check(_call(mcp, tool, args, key))

        one()
    _server_log_is_clean(server, server.settings)


def _call(mcp: Mcp, tool: str, args: Any, key: Any) -> Any:
    # Mcp.call types its key as a string; the wire takes any JSON, and so does the test.
    return mcp.call(tool, args, key)


# The arguments' JSON text: what no client library sends.
RAW_ARGUMENTS = [
    ("write_file", '{"path": "\\ud800.txt", "content": "x"}'),  # a lone surrogate
    ("write_file", '{"path": "notes.txt", "content": "\\udcff"}'),
    ("exec", '{"command": "exit 0 #\\ud800"}'),
    ("apply_patch", '{"patch": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("write_file", "[" * 100_000 + "]" * 100_000),
    ("write_file", '["path", "notes.txt"]'),
    ("write_file", '"notes.txt"'),
    ("read_file", '{"path": "notes.txt", "path": 7}'),
    ("exec", '{"command": "exit 0", "timeout_s": 1e999}'),
    ("exec", '{"command": "exit 0", "timeout_s": NaN}'),
]


def test_raw_requests_with_hostile_json(leased: tuple[ToolServer, Slots, Lease]) -> None:
    """Lone surrogates, deep nesting, arguments that are no object, non-JSON numbers: a
    tool result with a reason, or a JSON-RPC parse or invalid-params error; never 5xx."""
    server, _, stamp = leased
    for tool, arguments in RAW_ARGUMENTS:
        _raw(stamp, tool, arguments)
    _server_log_is_clean(server, server.settings)


def _raw(stamp: Lease, tool: str, arguments: str) -> None:
    body = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": '
        + json.dumps(tool)
        + ', "arguments": '
        + arguments
        + "}}"
    )
    answer = httpx.post(
        stamp.mcp_url,
        content=body.encode(),
        headers={
            "Authorization": f"Bearer {stamp.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2025-11-25",
        },
        timeout=60,
    )
    assert answer.status_code < 500, answer.text
    reply = answer.json()
    if "error" in reply:
        # A parse error or invalid params: the protocol's own answers, never internal.
        assert reply["error"]["code"] in (-32700, -32602), reply
    else:
        result = reply["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"].split(":", 1)[0] in CODES, result
