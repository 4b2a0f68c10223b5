"""``slotrunner demo --agent``: the demo's jobs run by an agent framework from the field.

Each framework runs its example from ``examples/`` (docs/architecture.md §Agents), with
the example's agent, config and sample files. The demo does not use the example's
``/tmp`` repository. It makes one git repository per job from the sample files and sets
the job id, the eval-run and the repository in the spec itself:

- ``mini-swe-agent``: mini-swe-agent's ``DefaultAgent`` and its offline
  ``DeterministicModel`` (``examples/mini_swe_agent/job.json``). Each bash command is a
  fenced ``exec`` call.
- ``openai-agents``: the Agents SDK's ``Agent`` over the slot's MCP door. Its
  ``OpenAIChatCompletionsModel`` calls the admission gateway, which forwards to the fake
  endpoint replaying ``script.json`` (``examples/openai_agents/gateway_job.json``). The
  demo serves both in this process.
- ``mcp``: the ``command`` planner kind runs the official ``mcp`` client
  (``examples/mcp_command_agent/``). The worker's ``PYTHONPATH`` includes ``examples/``,
  and the worker passes it on to the agent's process.

The examples come with a source checkout, not with the installed package. Without them,
or without the framework's package (the ``agents`` extra), the demo fails with one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ops.demo.sample_repo import init_repo
from ops.errors import OpsError
from runner.core.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class AgentDemoError(OpsError):
    """``slotrunner demo --agent`` cannot run here: no examples, or no framework package."""


@dataclass(frozen=True)
class Framework:
    """One ``--agent`` choice: the example it runs and what that example needs."""

    name: str
    example: str  # examples/<example>/
    job_file: str
    sample: str  # the directory under examples/ with the sample repository's files
    packages: tuple[str, ...]  # importable modules the worker needs
    blurb: str
    on_pythonpath: bool = False  # the worker imports the agent from examples/
    gateway: bool = False  # the model is the fake endpoint behind the admission gateway


FRAMEWORKS = {
    f.name: f
    for f in (
        Framework(
            "mini-swe-agent",
            "mini_swe_agent",
            "job.json",
            "mini_swe_agent/sample",
            ("minisweagent",),
            "mini-swe-agent's DefaultAgent with its deterministic model; each bash command "
            "a fenced exec call",
        ),
        Framework(
            "openai-agents",
            "openai_agents",
            "gateway_job.json",
            "openai_agents/sample",
            ("agents", "openai"),
            "the OpenAI Agents SDK over the slot's MCP door; its model the fake endpoint "
            "through the admission gateway",
            gateway=True,
        ),
        Framework(
            "mcp",
            "mcp_command_agent",
            "job.json",
            "python_agent/sample",
            ("mcp", "httpx2"),
            "the official mcp client as a command agent, in a process of its own",
            on_pythonpath=True,
        ),
    )
}


def check(name: str, examples: Path = EXAMPLES) -> Framework:
    """The framework named, once its example files and packages are all present."""
    framework = FRAMEWORKS[name]
    needed = [examples / framework.example / framework.job_file, examples / framework.sample]
    if framework.gateway:
        needed.append(examples / framework.example / "script.json")
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise AgentDemoError(
            f"slotrunner demo --agent {name} runs the example of a source checkout, "
            f"and {', '.join(missing)} is missing"
        )
    absent = [module for module in framework.packages if importlib.util.find_spec(module) is None]
    if absent:
        raise AgentDemoError(
            f"slotrunner demo --agent {name} needs {', '.join(absent)}: "
            "install the agents extra (pip install -e '.[agents]')"
        )
    return framework


def make_specs(
    framework: Framework, run_dir: Path, run_id: str, n_jobs: int, examples: Path = EXAMPLES
) -> list[dict[str, Any]]:
    """One job spec per job: the example's spec, each job on a fresh copy of the sample."""
    template = json.loads((examples / framework.example / framework.job_file).read_text())
    sample = examples / framework.sample
    files = {p.name: p.read_text() for p in sorted(sample.iterdir()) if p.is_file()}
    specs = []
    for index in range(n_jobs):
        job_id = f"demo-{run_id}-{index:02d}"
        repo = run_dir / f"sample-{index:02d}"
        base = init_repo(repo, files, f"{framework.name} sample")
        spec = json.loads(json.dumps(template))  # a deep copy, each job its own
        spec.update(job_id=job_id, eval_run=f"demo-{run_id}", repo=str(repo), base=base)
        specs.append(spec)
    return specs


@dataclass
class AgentStack:
    """What the demo runs beside the stack for a framework: the worker's extra
    environment and, for the gateway, the fake endpoint and the gateway themselves."""

    framework: Framework
    env: dict[str, str] = field(default_factory=dict)
    _endpoint: Any = None
    _gateway: Any = None
    _upstream: str = ""
    _bound: int = 0

    def start(self, settings: Settings, client: redis.Redis, specs: list[dict[str, Any]]) -> None:
        """Start what the framework needs and point ``specs`` at it; the worker is
        started afterwards with ``env``."""
        if self.framework.on_pythonpath:
            parts = [str(EXAMPLES), os.environ.get("PYTHONPATH", "")]
            self.env["PYTHONPATH"] = os.pathsep.join(part for part in parts if part)
        if not self.framework.gateway:
            return
        from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
        from ops.testing.fake_endpoint.server import serve
        from runner.gateway.app import create_app
        from runner.gateway.server import GatewayThread

        script_file = EXAMPLES / self.framework.example / "script.json"
        script = tuple(ScriptStep.model_validate(s) for s in json.loads(script_file.read_text()))
        self._bound = int(specs[0]["planner"]["model"].get("admission_bound", 4))
        # The endpoint takes no more than the run's bound, so the gateway's admission is
        # all that keeps it from answering 429.
        config = FakeEndpointConfig(seed=7, script=script, max_concurrency=self._bound)
        self._endpoint, port = serve(config)
        self._upstream = f"http://127.0.0.1:{port}/v1"
        self._gateway = GatewayThread(create_app(settings, redis_client=client)).start()
        self.env["SLOTRUNNER_GATEWAY_URL"] = self._gateway.url
        for spec in specs:
            spec["planner"]["model"]["base_url"] = self._upstream

    def describe(self) -> str:
        line = f"agent: {self.framework.blurb} (examples/{self.framework.example}/)"
        if self._gateway is not None:
            line += f"\ngateway {self._gateway.url}, upstream the fake endpoint {self._upstream}"
        return line

    def report(self) -> list[str]:
        """Lines for the summary: the gateway's and the endpoint's counts."""
        if self._gateway is None or self._endpoint is None:
            return []
        import httpx

        root = self._gateway.url.removesuffix("/v1")
        seen = httpx.get(f"{root}/stats", timeout=10).json()["gateway"]
        outcomes = {k: v for k, v in sorted(seen["outcomes"].items()) if v}
        served = self._endpoint.endpoint.stats()
        return [
            "gateway: " + (", ".join(f"{k} {v}" for k, v in outcomes.items()) or "no requests"),
            f"stale completions {seen['stale_completions']}; the endpoint's most concurrent "
            f"requests {served['max_in_flight_seen']} (the run's bound {self._bound}), "
            f"its 429s {served['answered_429']}",
        ]

    def stop(self) -> None:
        if self._gateway is not None:
            self._gateway.stop()
        if self._endpoint is not None:
            self._endpoint.close()
