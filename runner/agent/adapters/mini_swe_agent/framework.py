"""How mini-swe-agent is imported: its environment set first, so it never touches ``~``.

``import minisweagent`` makes ``$MSWEA_GLOBAL_CONFIG_DIR`` (by default
``~/.config/mini-swe-agent``), loads the ``.env`` file there into ``os.environ`` and
prints a banner unless ``MSWEA_SILENT_STARTUP`` is set; ``import litellm`` (its
OpenAI-compatible models) fetches a cost map from the network unless
``LITELLM_LOCAL_MODEL_COST_MAP`` is set. :func:`framework_env` sets all three for as
long as a job's agent is built and run, the config dir a scratch dir of that job's,
so nothing of one job's reaches a later one and the worker's home stays untouched.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

_FIXED = {"MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@contextmanager
def framework_env(config_dir: Path) -> Iterator[None]:
    """mini-swe-agent's and litellm's variables set (the config dir ``config_dir``),
    and put back as they were on exit."""
    wanted = {**_FIXED, "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir)}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def submitted(submission: str) -> Exception:
    """mini-swe-agent's own ``Submitted``, as its environments raise it: the agent adds
    the exit message and ``run()`` returns ``{"exit_status": "Submitted", "submission"}``."""
    if "minisweagent" not in sys.modules:
        # An environment used outside run() (a user's own loop that has not imported
        # mini-swe-agent yet): import it the same careful way.
        with (
            tempfile.TemporaryDirectory(prefix="slotrunner-mswea-") as scratch,
            framework_env(Path(scratch)),
        ):
            import minisweagent.exceptions  # noqa: F401
    from minisweagent.exceptions import Submitted

    message: dict[str, Any] = {
        "role": "exit",
        "content": submission,
        "extra": {"exit_status": "Submitted", "submission": submission},
    }
    return Submitted(message)
