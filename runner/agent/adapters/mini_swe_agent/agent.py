"""The ``python`` planner entry that runs mini-swe-agent's own ``DefaultAgent`` in a slot.

A job spec names it (docs/architecture.md §Agents)::

    {"kind": "python", "entry": "runner.agent.adapters.mini_swe_agent:run",
     "config": {"task": "...", "base_config": "default",
                "agent": {...}, "environment": {...}, "model": {...}}}

``agent``, ``environment`` and ``model`` are the sections of a mini-swe-agent config
file, merged over ``base_config`` (a config mini-swe-agent finds by name, such as
``default``, or a path on the worker) when one is named. The agent is
``DefaultAgent`` with :class:`SlotEnvironment`; the model is either

- ``{"model_class": "deterministic", "outputs": [...]}``: mini-swe-agent's offline
  ``DeterministicModel``. An output given as text is a reply in the text-based format
  (one ````` ```mswea_bash_command ````` block), parsed as ``LitellmTextbasedModel``
  parses one, at no cost; a mapping is passed as is (``make_output``'s shape).
- ``litellm`` or ``litellm_textbased`` with a ``model_name``: an OpenAI-compatible
  model whose every request goes through the job's admission gateway
  (``workspace.gateway_url`` and ``gateway_key`` as its ``api_base`` and ``api_key``;
  the name gets litellm's ``openai/`` provider), so it counts against the eval-run's
  bound. Without a gateway such a model is refused, never sent around it.

:func:`run` returns ``{"exit_status": "Submitted", "submission": ...}`` when the agent
submits, and raises :class:`MiniSweAgentError` when it ended any other way (a step or
cost limit, repeated format errors), so the job fails naming the exit status. A
refused call stops the agent and fails the job with the call's reason
(``runner.agent.adapters.mini_swe_agent.environment``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner.agent.adapters.mini_swe_agent.environment import (
    ENVIRONMENT_CLASS,
    SlotEnvironment,
    SlotEnvironmentConfig,
)
from runner.agent.adapters.mini_swe_agent.framework import framework_env
from runner.agent.api import Workspace
from runner.errors import RunnerError

# LitellmTextbasedModelConfig.action_regex (not imported: that module imports litellm).
ACTION_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"
DETERMINISTIC = ("deterministic", "minisweagent.models.test_models.DeterministicModel")
# OpenAI-compatible through the gateway ("" is mini-swe-agent's own default, litellm).
GATEWAY_MODELS = ("", "litellm", "litellm_textbased")
_AGENT_CLASSES = ("", "default", "minisweagent.agents.default.DefaultAgent")


class MiniSweAgentError(RunnerError):
    """A mini-swe-agent job whose config cannot run in a slot, or whose agent ended
    without submitting; the message says which."""


class MiniJobConfig(BaseModel):
    """The ``config`` of a job that runs :func:`run`."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1)
    base_config: str | None = Field(default=None, min_length=1)
    agent: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any]


def run(workspace: Workspace, config: dict[str, Any]) -> dict[str, str]:
    """Run ``DefaultAgent`` on ``config["task"]`` in ``workspace``'s slot until it
    submits (the module docstring); its exit status and submission."""
    try:
        job = MiniJobConfig.model_validate(config)
    except ValidationError as exc:
        raise MiniSweAgentError(f"mini-swe-agent config: {_problems(exc)}") from None
    if "exec" not in workspace.tools:
        raise MiniSweAgentError(
            f"mini-swe-agent runs bash through exec, which is not among this job's tools "
            f"({', '.join(workspace.tools)})"
        )
    prefix = f"slotrunner-mswea-{workspace.job_id}-a{workspace.attempt}-"
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch, framework_env(Path(scratch)):
        from minisweagent.agents.default import DefaultAgent

        base = _base_sections(job.base_config)
        env = SlotEnvironment(workspace, **_environment_section(base, job.environment))
        try:
            model = build_model(_merged(base.get("model"), job.model), workspace)
            agent = DefaultAgent(
                model, env, **_agent_section(_merged(base.get("agent"), job.agent))
            )
        except ValidationError as exc:  # the sections, as mini-swe-agent's models read them
            raise MiniSweAgentError(f"mini-swe-agent config: {_problems(exc)}") from None
        try:
            outcome = agent.run(job.task)
        except IndexError:
            if not _ran_out(model):
                raise
            raise MiniSweAgentError(
                f"the deterministic model ran out of outputs after {agent.n_calls - 1} "
                "without a submission"
            ) from None
    status = str(outcome.get("exit_status") or "")
    if status != "Submitted":
        raise MiniSweAgentError(
            f"mini-swe-agent ended with exit status {status or '(none)'} without submitting"
            f" after {agent.n_calls} model call(s)"
        )
    return {"exit_status": status, "submission": str(outcome.get("submission") or "")}


def build_model(section: dict[str, Any], workspace: Workspace) -> Any:
    """The model of a ``model`` section (the module docstring): deterministic, or an
    OpenAI-compatible one through the job's gateway."""
    cfg = dict(section)
    kind = str(cfg.pop("model_class", "") or "")
    if kind in DETERMINISTIC:
        from minisweagent.models.test_models import DeterministicModel

        regex = str(cfg.pop("action_regex", ACTION_REGEX))
        outputs = cfg.pop("outputs", None)
        if not isinstance(outputs, list) or not outputs:
            raise MiniSweAgentError("model.outputs: the deterministic model needs a list")
        replies = [_output(index, output, regex) for index, output in enumerate(outputs)]
        return DeterministicModel(outputs=replies, **cfg)  # type: ignore[no-untyped-call]
    if kind in GATEWAY_MODELS:
        config = gateway_model_config(kind or "litellm", cfg, workspace)
        import litellm
        from minisweagent.models import get_model

        # litellm prints a provider list whenever it cannot price the gateway's model.
        litellm.suppress_debug_info = True
        return get_model(config=config)
    raise MiniSweAgentError(
        f"model.model_class {kind!r}: a slot runs 'deterministic' (offline) or an "
        f"OpenAI-compatible model through the gateway ({', '.join(filter(None, GATEWAY_MODELS))})"
    )


def gateway_model_config(kind: str, cfg: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
    """The config of a litellm model pointed at the job's gateway, with its credential."""
    if not workspace.gateway_url:
        raise MiniSweAgentError(
            f"model.model_class {kind!r}: this job has no admission gateway "
            "(workspace.gateway_url is unset), and its model calls may not go around it"
        )
    name = str(cfg.get("model_name") or "")
    if not name:
        raise MiniSweAgentError("model.model_name: required for an OpenAI-compatible model")
    kwargs = {
        k: v
        for k, v in dict(cfg.get("model_kwargs") or {}).items()
        if k not in ("api_base", "base_url", "api_key")
    }
    kwargs |= {"api_base": workspace.gateway_url, "api_key": workspace.gateway_key or "-"}
    return {
        # litellm cannot price a model of the gateway's upstream; mini-swe-agent would
        # raise for every call without this.
        "cost_tracking": "ignore_errors",
        **cfg,
        "model_class": kind,
        "model_name": name if name.startswith("openai/") else f"openai/{name}",
        "model_kwargs": kwargs,
    }


def _ran_out(model: Any) -> bool:
    """Whether a deterministic model was asked past its last output."""
    outputs = getattr(getattr(model, "config", None), "outputs", None)
    index = getattr(model, "current_index", None)
    return isinstance(outputs, list) and isinstance(index, int) and index >= len(outputs)


def _output(index: int, output: Any, regex: str) -> dict[str, Any]:
    if isinstance(output, dict):
        return output
    if not isinstance(output, str):
        raise MiniSweAgentError(f"model.outputs[{index}]: a reply's text or a mapping")
    from minisweagent.exceptions import FormatError
    from minisweagent.models.test_models import make_output
    from minisweagent.models.utils.actions_text import parse_regex_actions

    try:
        actions = parse_regex_actions(output, action_regex=regex, format_error_template="{{error}}")
    except FormatError as exc:
        detail = exc.messages[0].get("content", "") if exc.messages else ""
        raise MiniSweAgentError(f"model.outputs[{index}]: {detail}") from None
    made: dict[str, Any] = make_output(output, actions, cost=0.0)
    return made


def _base_sections(name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    from minisweagent.config import get_config_from_spec

    try:
        loaded = get_config_from_spec(name)
    except (OSError, ValueError) as exc:
        raise MiniSweAgentError(f"base_config {name!r}: {exc}") from None
    if not isinstance(loaded, dict):
        raise MiniSweAgentError(f"base_config {name!r} is not a mapping of sections")
    return loaded


def _merged(base: Any, own: dict[str, Any]) -> dict[str, Any]:
    from minisweagent.utils.serialize import recursive_merge

    merged: dict[str, Any] = recursive_merge(base if isinstance(base, dict) else {}, own)
    return merged


def _environment_section(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The job's own section, strict; of a base config's (written, perhaps, for
    another environment: docker's image...) only the fields this environment has."""
    known = SlotEnvironmentConfig.model_fields
    section = base.get("environment")
    inherited = {k: v for k, v in (section or {}).items() if k in known}
    merged = _merged(inherited, dict(own))
    chosen = merged.pop("environment_class", ENVIRONMENT_CLASS)
    if chosen != ENVIRONMENT_CLASS:
        raise MiniSweAgentError(
            f"environment.environment_class {chosen!r}: in a slot, commands run only "
            f"through {ENVIRONMENT_CLASS} (the fenced exec tool)"
        )
    try:
        SlotEnvironmentConfig.model_validate(merged)
    except ValidationError as exc:
        raise MiniSweAgentError(f"environment: {_problems(exc)}") from None
    return merged


def _agent_section(section: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(section)
    chosen = str(cfg.pop("agent_class", "") or "")
    if chosen not in _AGENT_CLASSES:
        raise MiniSweAgentError(f"agent.agent_class {chosen!r}: a slot runs DefaultAgent")
    if cfg.get("output_path"):
        raise MiniSweAgentError(
            "agent.output_path: the trajectory would be written on the worker's disk, "
            "outside the slot"
        )
    cfg.pop("output_path", None)
    for field in ("system_template", "instance_template"):
        if not cfg.get(field):
            raise MiniSweAgentError(f"agent.{field}: required (or name a base_config)")
    return cfg


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
        for err in exc.errors()[:4]
    )
