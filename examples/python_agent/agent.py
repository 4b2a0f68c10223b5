"""A small agent for slotrunner's ``python`` planner: read a file, write a fix, test.

The job spec names it as ``{"kind": "python", "entry": "python_agent.agent:fix_and_test",
"config": {...}}``; the worker calls ``fix_and_test(workspace, config)`` with the handle
of the slot it leased (``runner.agent.api``). Every call below is a fenced tool call
with a receipt; the runner snapshots, releases and reports. Returning ends the job
``succeeded``; raising ends it ``failed`` with the exception as its reason.

config:
    path      the file to fix, relative to the work tree
    find      the text that is wrong in it
    replace   what it should say
    check     optional: a shell command run with the ``exec`` tool after the fix
"""

from __future__ import annotations

from typing import Any

from runner.agent.api import Workspace


def fix_and_test(workspace: Workspace, config: dict[str, Any]) -> None:
    path = str(config["path"])
    names = [entry["name"] for entry in workspace.list_dir(path=".")["entries"]]
    if path.split("/")[0] not in names:
        raise FileNotFoundError(f"{path} is not in the work tree (it has {names})")
    source = workspace.read_file(path=path)["content"]
    find, replace = str(config["find"]), str(config["replace"])
    if find not in source:
        raise ValueError(f"{path} does not contain {find!r}: nothing to fix")
    workspace.write_file(path=path, content=source.replace(find, replace, 1))
    check = config.get("check")
    if check and "exec" in workspace.tools:
        ran = workspace.exec(command=str(check), timeout_s=60.0)
        if ran["exit_code"] != 0:
            raise RuntimeError(f"{check!r} exited {ran['exit_code']}: {ran['output'][-500:]}")
    tests = workspace.run_tests()
    if not tests["passed"]:
        raise RuntimeError(
            f"the tests still fail (exit {tests['exit_code']}): {tests['stderr'][-1000:]}"
        )
