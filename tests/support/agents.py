"""Agent functions for ``python`` planner tests, imported by the real worker.

A job names one as ``tests.support.agents:<name>``; the worker imports it from this
checkout (:func:`agent_pythonpath` puts the checkout and ``examples/`` on its path).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from runner.agent.api import Workspace, WorkspaceCallError
from tests.support.repos import REPO

# Not callable: an entry naming it is rejected before any slot is leased.
NOT_CALLABLE = 42


def agent_pythonpath() -> str:
    """``PYTHONPATH`` for a worker (or ``slotrunner submit``) that imports these agents
    and the example's (``python_agent.agent``)."""
    parts = [str(REPO / "examples"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(part for part in parts if part)


def takes_one(workspace: Workspace) -> None:
    """Cannot be called as fn(workspace, config)."""


def write_then_raise(workspace: Workspace, config: dict[str, Any]) -> None:
    """One write applied, then the agent fails: the job fails naming the exception."""
    workspace.write_file(path=str(config["path"]), content="written before the failure\n")
    raise ValueError(str(config.get("message", "the agent gave up")))


def poll_until_stopped(workspace: Workspace, config: dict[str, Any]) -> None:
    """Writes ``started``, then reads until the handle refuses (a cancel, a newer
    attempt): that refusal propagates, as an agent that does not catch it would."""
    workspace.write_file(path="started", content="1\n")
    give_up = time.monotonic() + float(config.get("give_up_s", 60))
    while time.monotonic() < give_up:
        workspace.git_status()
        time.sleep(0.05)


def sleep_then_write(workspace: Workspace, config: dict[str, Any]) -> None:
    """Writes ``started``, then sleeps without calling the handle (a model that never
    answers), then tries one more write: refused, since the job ended meanwhile."""
    workspace.write_file(path="started", content="1\n")
    time.sleep(float(config.get("sleep_s", 30)))
    try:
        workspace.write_file(path="late.txt", content="too late\n")
    except WorkspaceCallError:
        return


def chat_through_gateway(workspace: Workspace, config: dict[str, Any]) -> None:
    """One chat completion through the job's gateway URL and credential, with the
    official client; its answer written into the tree. Keeps the credential in
    ``config["key_file"]`` (outside the slot) for the test to try once the job ended."""
    import openai

    assert workspace.gateway_url is not None and workspace.gateway_key is not None
    Path(str(config["key_file"])).write_text(workspace.gateway_key)
    client = openai.OpenAI(
        base_url=workspace.gateway_url, api_key=workspace.gateway_key, max_retries=0
    )
    reply = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hello"}]
    )
    workspace.write_file(path="reply.txt", content=f"{reply.choices[0].message.content}\n")


def mini_recording_lease(workspace: Workspace, config: dict[str, Any]) -> Any:
    """mini-swe-agent's adapter, after writing this attempt's lease token and MCP URL to
    ``config["record_lease_to"]/a<attempt>.json``, so a test can try them once the
    attempt is dead."""
    import json

    from runner.agent.adapters.mini_swe_agent import run

    record = Path(config.pop("record_lease_to")) / f"a{workspace.attempt}.json"
    record.write_text(json.dumps({"token": workspace.token, "mcp_url": workspace.mcp_url}))
    return run(workspace, config)
