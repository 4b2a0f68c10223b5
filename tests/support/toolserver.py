"""A real tool server process for one test's home, and the environment of its children."""

from __future__ import annotations

import os
from pathlib import Path

from ops.testing.faultplan import FaultPlan
from ops.testing.stack import Child, StackError, free_port, stack_env, start_toolserver
from runner.core.settings import Settings


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a child process (tool server, worker, CLI) serving ``settings``."""
    # ``extra`` wins over the settings: a test may start a child with, say, its own token.
    return stack_env(os.environ, **{**settings.to_env(), **extra})


class ToolServer:
    """A real tool server process serving one test's home.

    ``slotrunner toolserver`` itself, unless the test asks for a seam: ``faults=True``
    starts the test server with a fault plan the test arms while it runs
    (``self.faults``), ``fence=False`` with the envelope check off
    (``ops.testing.toolserver``).
    """

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        *,
        faults: bool = False,
        fence: bool = True,
        **extra_env: str,
    ) -> None:
        self.log_dir = log_dir
        self.extra_env = extra_env
        self.fence = fence
        self.faults = FaultPlan(log_dir.parent / "faults") if faults else None
        self.child: Child | None = None
        for tries_left in reversed(range(3)):
            self.port = free_port()
            self.settings = settings.with_(toolserver_url=f"http://127.0.0.1:{self.port}")
            try:
                self.start()
                break
            except StackError as exc:
                # Another process of the suite was handed the same free port first.
                if "address already in use" not in str(exc).lower() or not tries_left:
                    raise

    @property
    def url(self) -> str:
        return self.settings.toolserver_url

    def start(self, **extra_env: str) -> None:
        env = child_env(self.settings, **{**self.extra_env, **extra_env})
        self.child = start_toolserver(
            env,
            self.port,
            self.log_dir,
            fence=self.fence,
            faults=self.faults.root if self.faults is not None else None,
        )

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None
