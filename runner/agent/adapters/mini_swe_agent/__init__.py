"""mini-swe-agent in a slot: its ``DefaultAgent``, its bash commands through ``exec``.

The entry of a job is ``runner.agent.adapters.mini_swe_agent:run`` (``agent.py``: the
config it takes, the models it may use); the environment class, for a
``environment_class`` of one's own config or a loop of one's own, is
``runner.agent.adapters.mini_swe_agent.SlotEnvironment`` (``environment.py``).
mini-swe-agent itself (the ``agents`` extra) is imported only when a job runs, with
its environment set first (``framework.py``). docs/architecture.md §Agents.
"""

from runner.agent.adapters.mini_swe_agent.agent import MiniJobConfig, MiniSweAgentError, run
from runner.agent.adapters.mini_swe_agent.environment import (
    ENVIRONMENT_CLASS,
    SlotEnvironment,
    SlotEnvironmentConfig,
)

__all__ = [
    "ENVIRONMENT_CLASS",
    "MiniJobConfig",
    "MiniSweAgentError",
    "SlotEnvironment",
    "SlotEnvironmentConfig",
    "run",
]
