"""The published OpenAPI schema (tools/server/openapi.py): built from the models the
server validates with, every refusal an {error, message} of the design's reasons, and
each tool's real answers valid against its documented models."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema_rs
import pytest

from runner.core.ids import valid_job_id
from runner.core.settings import Settings
from tests.support.execslots import Slots, envelope
from tests.support.toolserver import ToolServer
from tools import registry
from tools.builtin import write_job
from tools.reasons import Reason
from tools.server import wire
from tools.server.app import create_app
from tools.server.mcp import tool_definitions

REASONS = {reason.value for reason in Reason}


def document(settings: Settings, *, token: str | None = None) -> dict[str, Any]:
    app = create_app(settings.with_(sandbox="off", token=token))
    doc: dict[str, Any] = app.openapi()
    return doc


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return resolve(doc, doc["components"]["schemas"][ref.rsplit("/", 1)[1]])


def refs(schema: dict[str, Any]) -> list[str]:
    if "$ref" in schema:
        return [schema["$ref"].rsplit("/", 1)[1]]
    return [name for option in schema.get("anyOf", []) for name in refs(option)]


def test_each_tool_has_an_operation_with_the_models_the_server_validates_with(
    settings: Settings,
) -> None:
    """The request body is the envelope (its tool fixed) and the registry's argument model;
    the 200 is the tool's result model or a failure; MCP's tools/list shows the same
    argument schemas."""
    doc = document(settings)
    schemas = doc["components"]["schemas"]
    for name, spec in registry.TOOLS.items():
        operation = doc["paths"][f"/v1/tools/{name}"]["post"]
        body = resolve(doc, operation["requestBody"]["content"]["application/json"]["schema"])
        envelope_schema = resolve(doc, body["properties"]["envelope"])
        assert envelope_schema["properties"]["tool"]["const"] == name
        assert (
            envelope_schema["additionalProperties"] is False
            and body["additionalProperties"] is False
        )
        args_names = refs(body["properties"]["args"])
        assert args_names == [spec.args_model.__name__]
        assert schemas[spec.args_model.__name__] == json.loads(
            json.dumps(spec.args_model.model_json_schema())
        )
        assert "args" in body.get("required", []) or not any(
            field.is_required() for field in spec.args_model.model_fields.values()
        )
        reply = resolve(doc, operation["responses"]["200"]["content"]["application/json"]["schema"])
        assert refs(reply["properties"]["result"]) == [spec.result_model.__name__, "ToolFailure"]
        mcp_schema = dict(tool_definitions()[name].input_schema)
        assert mcp_schema["properties"] == schemas[spec.args_model.__name__]["properties"]


def test_every_error_is_an_error_message_body_with_the_design_reasons(settings: Settings) -> None:
    """No FastAPI HTTPValidationError anywhere; every 4xx/5xx JSON body of the HTTP API
    names its reasons from tools/reasons.py (or the receipt lookup's no_receipt)."""
    doc = document(settings, token="t")
    assert "HTTPValidationError" not in json.dumps(doc)
    for path, operations in doc["paths"].items():
        if path == "/mcp":
            continue  # JSON-RPC bodies (test_statuses_headers_...)
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) < 400:
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert refs(schema), (method, path, status)  # a named model, never inline
                for name in refs(schema):
                    body = doc["components"]["schemas"][name]
                    error = body["properties"]["error"]
                    allowed = set(error.get("enum", [error.get("const")]))
                    assert allowed <= REASONS | {"no_receipt"}, (path, status, allowed)
                    assert {"error"} <= set(body["required"]), (path, status, name)
            assert operation["responses"]["401"], (method, path)
            assert operation["security"], (method, path)


def test_statuses_headers_and_media_types_are_the_real_ones(settings: Settings) -> None:
    """429 carries Retry-After, /metrics is text/plain, the MCP door's 401 is documented
    with WWW-Authenticate, and without a server token no route but /mcp asks for one."""
    doc = document(settings)
    exec_op = doc["paths"]["/v1/tools/exec"]["post"]
    assert exec_op["responses"]["429"]["headers"]["Retry-After"]["required"] is True
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    mcp = doc["paths"]["/mcp"]["post"]
    assert mcp["security"] == [{"leaseToken": []}]
    assert "WWW-Authenticate" in mcp["responses"]["401"]["headers"]
    assert all(
        "security" not in op and "401" not in op["responses"]
        for path, ops in doc["paths"].items()
        if path != "/mcp"
        for op in ops.values()
    )
    receipts = doc["paths"]["/v1/receipts/{key}"]["get"]["responses"]
    assert set(receipts) >= {"200", "404", "409", "413", "422", "503"}


@pytest.mark.parametrize(
    "job_id", ["job-A", "a.lock.b", "x" * 128, "abc\n", "a..b", "a.lock", ".a", "x" * 129, ""]
)
def test_the_job_id_pattern_is_the_rule(settings: Settings, job_id: str) -> None:
    """The envelope's published pattern (JSON Schema semantics) accepts exactly the job
    ids runner.core.ids does; "abc\\n" is refused by both (#11, tests/runner/core/test_ids.py)."""
    envelope_schema = document(settings)["components"]["schemas"]["ReadFileEnvelope"]
    validator = jsonschema_rs.validator_for(envelope_schema["properties"]["job_id"])
    assert validator.is_valid(job_id) is valid_job_id(job_id)


def test_each_tool_answers_what_its_models_say(toolserver: ToolServer, slots: Slots) -> None:
    """A real call of every tool, and a failing one: each 200 body validates against the
    tool's reply model, and the refusals against theirs."""
    stamp = slots.lease("job-A")
    write_job(
        slots.dir(stamp),
        {"job_id": "job-A", "generation": stamp.generation, "test_command": ["true"]},
    )
    patch = "--- a/README\n+++ b/README\n@@ -1 +1 @@\n-sample\n+patched\n"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "README"}),
        ("list_dir", {}),
        ("git_status", {}),
        ("write_file", {"path": "new/a.txt", "content": "a\n"}),
        ("apply_patch", {"patch": patch}),
        ("mv", {"src": "new/a.txt", "dst": "b.txt"}),
        ("rm", {"path": "b.txt"}),
        ("git_commit", {"message": "all of it"}),
        ("run_tests", {}),
        ("exec", {"command": "echo hi"}),
        ("read_file", {"path": "pkg"}),  # a directory: 200, result.error
        ("mv", {"src": "README", "dst": "pkg"}),  # a failed receipt
    ]
    for index, (tool, args) in enumerate(calls):
        spec = registry.TOOLS[tool]
        key = f"job-A:{index}" if spec.mutating else None
        body = {"envelope": envelope(stamp, key, tool), "args": args}
        response = httpx.post(f"{toolserver.url}/v1/tools/{tool}", json=body, timeout=60)
        assert response.status_code == 200, (tool, response.text)
        wire.reply_model(spec).model_validate(response.json())
    refused = httpx.post(
        f"{toolserver.url}/v1/tools/rm",
        json={"envelope": envelope(stamp, None, "rm"), "args": {"path": "README"}},
        timeout=30,
    )
    assert refused.status_code == 409
    wire.Conflict.model_validate(refused.json())
