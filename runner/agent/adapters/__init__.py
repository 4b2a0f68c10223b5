"""Adapters for agents from the field, each run as a ``python`` planner's entry.

An adapter sits on the agent API (``runner.agent.api``) and nothing of the runner
imports it (the import contracts of pyproject.toml): a job names it by its entry, as
any user's agent. Each imports its framework only when a job runs it, so the runner
works without the ``agents`` extra (docs/architecture.md §Agents).

- ``runner.agent.adapters.mini_swe_agent:run``: mini-swe-agent's ``DefaultAgent`` with
  an environment whose bash commands go through the fenced ``exec`` tool.
- ``runner.agent.adapters.openai_agents:run``: the OpenAI Agents SDK's ``Agent`` over
  the slot's MCP door with the lease token, each call fenced by the handle.
"""
