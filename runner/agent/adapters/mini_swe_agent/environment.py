"""mini-swe-agent's environment over a slot: every bash command is a fenced ``exec`` call.

mini-swe-agent's agents run each action through their environment's
``execute(action, cwd="", *, timeout=None)`` and read back ``{"output", "returncode",
"exception_info"}`` (``minisweagent.environments.local.LocalEnvironment``).
:class:`SlotEnvironment` answers the same way, but the command runs in the job's slot
through :meth:`runner.agent.api.Workspace.exec`: the envelope check, the sandbox,
the receipt and the log line of docs/architecture.md §Exec tool, under the key of
the handle's step. What differs from ``LocalEnvironment``, and why:

- A command past its timeout is killed (exit 137, ``timed_out``); the agent sees what
  ``LocalEnvironment`` shows for ``subprocess.TimeoutExpired``: ``returncode`` -1, the
  output so far and ``exception_info`` naming the timeout.
- A refused call (:class:`runner.agent.api.WorkspaceCallError`: a stale lease, a
  cancel, the deadline) is raised, never shown to the model: ``DefaultAgent.run``
  re-raises it, so the agent stops and the job ends with the reason.
- ``get_template_vars`` gives the config and the platform, not ``os.environ``: the
  worker's environment is no business of the prompt.
- ``cwd`` is a directory of the work tree (the command ``cd``s there first); ``env``
  is exported before the command, since ``exec`` takes no environment.
"""

from __future__ import annotations

import platform
import re
import shlex
import subprocess
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runner.agent.adapters.mini_swe_agent.framework import SUBMIT_MARKER, submitted
from runner.agent.api import Workspace
from tools.registry import MAX_EXEC_TIMEOUT_S

# What config.environment_class may say: only this class runs commands in the slot.
ENVIRONMENT_CLASS = "runner.agent.adapters.mini_swe_agent.SlotEnvironment"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SlotEnvironmentConfig(BaseModel):
    """The ``environment`` section of a mini-swe-agent config, as this environment
    reads it (LocalEnvironment's fields; anything else is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    cwd: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=30, gt=0, le=MAX_EXEC_TIMEOUT_S)

    @field_validator("cwd")
    @classmethod
    def _inside(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/") or "\x00" in value:
            raise ValueError("cwd must be a directory of the work tree, relative to its root")
        return value

    @field_validator("env")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(name for name in value if not _NAME.fullmatch(name))
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(bad)}")
        return value


class SlotEnvironment:
    """A mini-swe-agent environment whose commands run in ``workspace``'s slot.

    Built by :func:`runner.agent.adapters.mini_swe_agent.run` from the config's
    ``environment`` section; a loop of one's own may build it as
    ``SlotEnvironment(workspace, timeout=60)`` and hand it to ``DefaultAgent``.
    """

    def __init__(self, workspace: Workspace, **kwargs: Any) -> None:
        self.workspace = workspace
        self.config = SlotEnvironmentConfig(**kwargs)

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Run ``action["command"]`` in the slot; mini-swe-agent's result mapping, or
        ``Submitted`` when the first line of its output is the submit marker."""
        command = str(action.get("command", ""))
        wait_s = float(timeout or self.config.timeout)
        if not command.strip():
            # bash -c "" does nothing and exits 0; exec refuses a blank command.
            output: dict[str, Any] = {"output": "", "returncode": 0, "exception_info": ""}
        else:
            result = self.workspace.exec(
                command=self._prefixed(command, cwd or self.config.cwd), timeout_s=wait_s
            )
            output = _as_mini_output(command, wait_s, result)
        self._check_finished(output)
        return output

    def _prefixed(self, command: str, cwd: str) -> str:
        lines = []
        if cwd and cwd != ".":
            lines.append(f"cd -- {shlex.quote(cwd)} || exit 1")
        if self.config.env:
            pairs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.config.env.items()))
            lines.append(f"export {pairs}")
        return "\n".join([*lines, command])

    def _check_finished(self, output: dict[str, Any]) -> None:
        """As every environment of mini-swe-agent's: the marker on the first line and
        exit 0 submit what follows it."""
        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            raise submitted("".join(lines[1:]))

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        slot = {
            "slot_id": self.workspace.slot_id,
            "job_id": self.workspace.job_id,
            "attempt": self.workspace.attempt,
        }
        return self.config.model_dump() | platform.uname()._asdict() | slot | kwargs

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": ENVIRONMENT_CLASS,
                }
            }
        }


def _as_mini_output(command: str, timeout_s: float, result: dict[str, Any]) -> dict[str, Any]:
    """An ``exec`` result in mini-swe-agent's shape (LocalEnvironment's for a timeout)."""
    text = str(result.get("output", ""))
    if result.get("timed_out"):
        seconds = int(timeout_s) if float(timeout_s).is_integer() else timeout_s
        expired = subprocess.TimeoutExpired(command, seconds)
        return {
            "output": text,
            "returncode": -1,
            "exception_info": f"An error occurred while executing the command: {expired}",
            "extra": {"exception_type": type(expired).__name__, "exception": str(expired)},
        }
    return {"output": text, "returncode": int(result["exit_code"]), "exception_info": ""}
