"""The tools package's error tree: every error the tools package raises on purpose.

Each error carries a :class:`tools.reasons.Reason` (``reason``): the named value that
the tool server writes in its 4xx/5xx bodies and ``tool_result.reason`` log fields,
and that the worker's client reports. Each class is defined next to the code that
raises it and derives from :class:`ToolError`, so a caller (the CLI, the janitor) can
catch the whole package with one ``except``. A class that callers also catch as a
built-in keeps it as a second base (marked ``+``)::

    ToolError                          reason: Reason (default malformed)
    ├── MalformedRequest               tools.envelope: a hook request without the
    │                                  envelope's fields (malformed)
    ├── PathRefused                    tools.paths.names: a path outside the work tree, or
    │                                  into .git (outside_workspace)
    ├── ToolFailed                     tools.builtin: the tool ran and failed for good;
    │                                  the tree is unchanged (malformed)
    ├── SandboxUnavailable             tools.sandbox.policy: the sandbox is required but
    │                                  cannot confine (sandbox_unavailable)
    ├── KeyBoundToOtherJob             tools.receipts.store: the key belongs to another
    │                                  job forever (key_bound_to_other_job)
    ├── ReceiptDurabilityError         tools.receipts.log: a receipt write or fsync
    │                                  failed, never retried (outcome_unknown)
    ├── ServerConfigError              tools.server.app: the server would start unsafe
    │                                  (unauthorized: off loopback without a token)
    └── ToolCallError                  tools.client: the worker's side of a call
        ├── StaleEnvelope              refused locally, nothing sent (the stamp's reason)
        ├── ToolRefused                the server said no (4xx with its reason)
        ├── OutcomeUnknown             sent, no answer, and the receipt store cannot
        │                              tell (outcome_unknown)
        └── TransportFailed            not sent or not answered, and not retried
                                       further (transport_failed; ``failure`` says how)

Private control-flow exceptions (``tools.client._Failure``, ``_Unsettled``) never
leave their module and are not part of the tree. ``tests/tools/test_errors.py`` checks
that every public exception class of the package is drawn here and derives from the
root.
"""

from __future__ import annotations

from tools.reasons import Reason

__all__ = ["ToolError"]


class ToolError(Exception):
    """Base of the tools package's error tree: a refusal or failure carrying its reason."""

    reason: Reason = Reason.MALFORMED

    def __init__(self, message: str, reason: Reason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.reason.value
