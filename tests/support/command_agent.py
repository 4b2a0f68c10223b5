"""A ``command`` agent for tests, run by the real worker as
``python3 -m tests.support.command_agent BEHAVIOUR`` (``PYTHONPATH``: the checkout).

It writes what the test needs to know into ``$OUT`` (a directory outside every slot,
given in the spec's ``env``), one file per attempt:

- ``report``: its environment, working directory and pid; a ``write_file`` through the
  MCP door with its lease token; with a gateway, one chat completion through it with
  an ``openai.OpenAI()`` that is given no configuration at all.
- ``hold``: its pid, then it waits to be ended (``--ignore-term``: SIGTERM does not end
  it); an attempt after the first exits 0 at once.
- ``leaver``: starts a grandchild in a session of its own that, five seconds later,
  would write ``late.txt`` into the slot's tree ($SLOTS/<slot>/work), then exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.mcpclient import mcp_session

CONTRACT = (
    "SLOTRUNNER_MCP_URL",
    "SLOTRUNNER_TOKEN",
    "SLOTRUNNER_GATEWAY_URL",
    "SLOTRUNNER_GATEWAY_KEY",
    "SLOTRUNNER_JOB_ID",
    "SLOTRUNNER_ATTEMPT",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
)
LEAVER = 'echo $$ > "$0/leaver.pid"; sleep 5; echo late > "$1/late.txt"; exec sleep 600'


def out(name: str) -> Path:
    return Path(os.environ["OUT"]) / f"{name}-a{os.environ['SLOTRUNNER_ATTEMPT']}"


def publish(name: str, payload: Any) -> None:
    """Written whole, then renamed: a test polling for it never reads half of it."""
    target = out(name)
    part = target.with_suffix(".part")
    part.write_text(json.dumps(payload))
    part.rename(target)


def report() -> None:
    found: dict[str, Any] = {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
    }
    with mcp_session(os.environ["SLOTRUNNER_MCP_URL"], os.environ["SLOTRUNNER_TOKEN"]) as mcp:
        wrote = mcp.call("write_file", {"path": "agent.txt", "content": "via mcp\n"}, key="w-1")
        found["write_file"] = wrote.structured_content
    if "OPENAI_BASE_URL" in os.environ:
        import openai

        reply = openai.OpenAI(max_retries=0).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hello"}]
        )
        found["completion"] = reply.choices[0].message.content
    publish("report", found)


def hold(ignore_term: bool) -> None:
    if os.environ["SLOTRUNNER_ATTEMPT"] != "1":
        publish("pid", os.getpid())
        return
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    publish("pid", os.getpid())
    print("holding", flush=True)
    time.sleep(600)


def leaver() -> None:
    slot = os.environ["SLOTRUNNER_TOKEN"].split(".")[1]
    tree = Path(os.environ["SLOTS"]) / slot / "work"
    subprocess.Popen(
        ["sh", "-c", LEAVER, os.environ["OUT"], str(tree)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid_file = Path(os.environ["OUT"]) / "leaver.pid"
    while not pid_file.exists() or not pid_file.read_text().strip():
        time.sleep(0.01)


def main(argv: list[str]) -> None:
    behaviour = argv[0]
    if behaviour == "report":
        report()
    elif behaviour == "hold":
        hold("--ignore-term" in argv)
    elif behaviour == "leaver":
        leaver()
    else:
        raise SystemExit(f"unknown behaviour {behaviour!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
