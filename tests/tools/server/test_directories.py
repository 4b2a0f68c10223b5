"""A path that names a directory where a tool needs a file: a refusal with its reason,
never a 500 (#15). A mutating tool is refused 422 malformed before anything is recorded
(the key stays unused); read_file answers its failed result, as for any file it cannot
read."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.execslots import Slots, envelope
from tests.support.toolserver import ToolServer

DIRECTORIES = [".", "./", "pkg", "pkg/", "./pkg", "pkg/."]


def call(url: str, body: dict[str, Any], tool: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/tools/{tool}", json=body, timeout=30)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("write_file", lambda p: {"path": p, "content": "x"}),
        ("rm", lambda p: {"path": p}),
        ("mv", lambda p: {"src": p, "dst": "elsewhere"}),
    ],
)
def test_a_mutating_tool_on_a_directory_is_malformed_and_records_nothing(
    toolserver: ToolServer, slots: Slots, tool: str, args: Any
) -> None:
    stamp = slots.lease("job-A")
    for path in DIRECTORIES:
        key = f"job-A:{tool}:{path}"
        body = {"envelope": envelope(stamp, key, tool), "args": args(path)}
        response = call(toolserver.url, body, tool)
        assert response.status_code == 422, (path, response.text)
        refusal = response.json()
        assert refusal["error"] == "malformed" and "directory" in refusal["message"], refusal
        lookup = httpx.get(f"{toolserver.url}/v1/receipts/{key}", params={"slot": stamp.slot_id})
        assert lookup.status_code == 404 and lookup.json()["status"] == "absent"
    assert (slots.work(stamp) / "pkg" / "lock.py").is_file()
    assert "Traceback" not in (toolserver.log_dir / "toolserver.out").read_text()


def test_read_file_of_a_directory_is_a_failed_read(toolserver: ToolServer, slots: Slots) -> None:
    stamp = slots.lease("job-A")
    for path in DIRECTORIES:
        body = {"envelope": envelope(stamp, None, "read_file"), "args": {"path": path}}
        response = call(toolserver.url, body, "read_file")
        assert response.status_code == 200, (path, response.text)
        assert "is a directory" in response.json()["result"]["error"]


def test_an_empty_path_is_malformed(toolserver: ToolServer, slots: Slots) -> None:
    stamp = slots.lease("job-A")
    for tool in ("write_file", "read_file", "rm", "list_dir"):
        body = {"envelope": envelope(stamp, f"job-A:{tool}", tool), "args": {"path": ""}}
        if tool == "write_file":
            body["args"]["content"] = "x"
        response = call(toolserver.url, body, tool)
        assert response.status_code == 422 and response.json()["error"] == "malformed"
