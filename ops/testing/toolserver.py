"""A tool server for test stacks: ``python -m ops.testing.toolserver [options]``.

The same server as ``slotrunner toolserver`` (same app factory, settings, endpoints
and log), built with the seams a normally started server has no way to change,
because they are arguments of ``tools.server.app.create_app`` and not environment
variables or files it looks for:

    --fence off        the envelope check lets every call through: the incident demo's
                       first run, the chaos campaign's control and the fence-off bench
                       arm show what a broken fence lets happen (and that it is seen)
    --faults DIR       a fault plan (``ops.testing.faultplan``) armed at run time: EIO
                       on the fsyncs of a slot, a SIGKILL after a call's effect

``ops.testing.stack.start_toolserver`` starts this module when a stack asks for either.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click
from fastapi import FastAPI

from ops.testing.faultplan import FaultPlan
from runner.core.durable import os_fsync
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from tools.envelope import Envelope
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore
from tools.server.app import DEFAULT_MAX_CONCURRENT, create_app, run_app
from tools.server.seams import envelope_fence


def fence_off(
    stamp: Stamp, envelope: Envelope, mutating: bool, store: ReceiptStore, now: datetime
) -> Reason | None:
    """A fence that lets every call through: what the envelope check is there to stop."""
    return None


def create_test_app(
    settings: Settings,
    *,
    fence: bool = True,
    faults: FaultPlan | None = None,
    bind_host: str = "127.0.0.1",
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
) -> FastAPI:
    """The tool server's app with its fence off, or a fault plan's fsync and crash."""
    return create_app(
        settings,
        bind_host=bind_host,
        max_concurrent=max_concurrent,
        fence=envelope_fence if fence else fence_off,
        fsync=faults.fsync if faults is not None else os_fsync,
        hooks=faults,
    )


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, required=True)
@click.option("--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT, show_default=True)
@click.option("--fence", type=click.Choice(["on", "off"]), default="on", show_default=True)
@click.option(
    "--faults",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The fault plan's directory (created when absent).",
)
def main(host: str, port: int, max_concurrent: int, fence: str, faults: Path | None) -> None:
    """Serve this host's slots with the fence off or a fault plan armed (tests only)."""
    settings = Settings.from_env()
    plan = FaultPlan(faults) if faults is not None else None
    app = create_test_app(
        settings, fence=fence == "on", faults=plan, bind_host=host, max_concurrent=max_concurrent
    )
    run_app(app, host, port)


if __name__ == "__main__":
    main(sys.argv[1:])
