"""The OpenAI-compatible admission gateway (docs/architecture.md §Gateway).

Agents that run their own inference loop (a ``command`` or ``python`` planner, any
framework) send their chat completions here; every request holds an admission lease
of its eval-run's desk, so the run's bound holds across every worker and framework.
The job runner mints each agent's credential with :func:`mint_credential` (and ends
it with :func:`revoke_credential`); ``slotrunner gateway`` serves
``runner.gateway.app.create_app``.
"""

from runner.gateway.credentials import Credential, mint_credential, revoke_credential

__all__ = ["Credential", "mint_credential", "revoke_credential"]
