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
    --effect noop      ``write_file`` records its intent and outcome but writes nothing
                       (:class:`NoopEffect`): the benchmark's floor of the same call
                       with nothing to apply (``bench/`` pipeline)

``ops.testing.stack.start_toolserver`` starts this module when a stack asks for either.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from fastapi import FastAPI

from ops.testing.faultplan import FaultPlan
from runner.core.durable import os_fsync
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from tools import builtin
from tools.envelope import Envelope
from tools.reasons import Reason
from tools.receipts.store import ReceiptStore
from tools.server.app import DEFAULT_MAX_CONCURRENT, create_app, run_app
from tools.server.seams import CallHooks, envelope_fence


def fence_off(
    stamp: Stamp, envelope: Envelope, mutating: bool, store: ReceiptStore, now: datetime
) -> Reason | None:
    """A fence that lets every call through: what the envelope check is there to stop."""
    return None


class NoopEffect(CallHooks):
    """``write_file`` with everything but its write: the path walk, the digests, both
    receipt records and the log line happen, the tree is left alone, and the result is
    what the write would have returned. Every other tool runs as it does."""

    def effect(
        self, tool: str, ctx: builtin.Context, args: Any, envelope: Envelope
    ) -> dict[str, Any]:
        if tool != "write_file":
            return super().effect(tool, ctx, args, envelope)
        data = args.content.encode("utf-8")
        return {"path": args.path, "bytes": len(data), "digest": builtin.sha256(data)}


def create_test_app(
    settings: Settings,
    *,
    fence: bool = True,
    faults: FaultPlan | None = None,
    noop_effect: bool = False,
    bind_host: str = "127.0.0.1",
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
) -> FastAPI:
    """The tool server's app with its fence off, a fault plan's fsync and crash, or
    ``write_file``'s effect skipped (not with a fault plan: both are the call hooks)."""
    if faults is not None and noop_effect:
        raise ValueError("a fault plan and the no-op effect are both call hooks: pick one")
    return create_app(
        settings,
        bind_host=bind_host,
        max_concurrent=max_concurrent,
        fence=envelope_fence if fence else fence_off,
        fsync=faults.fsync if faults is not None else os_fsync,
        hooks=NoopEffect() if noop_effect else faults,
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
@click.option(
    "--effect",
    type=click.Choice(["real", "noop"]),
    default="real",
    show_default=True,
    help="noop: write_file records its receipts but writes nothing (a benchmark floor).",
)
def main(
    host: str, port: int, max_concurrent: int, fence: str, faults: Path | None, effect: str
) -> None:
    """Serve this host's slots with the fence off, a fault plan armed or write_file's
    effect skipped (tests and benchmarks only)."""
    if faults is not None and effect == "noop":
        raise click.UsageError("--faults and --effect noop cannot be used together")
    settings = Settings.from_env()
    plan = FaultPlan(faults) if faults is not None else None
    app = create_test_app(
        settings,
        fence=fence == "on",
        faults=plan,
        noop_effect=effect == "noop",
        bind_host=host,
        max_concurrent=max_concurrent,
    )
    run_app(app, host, port)


if __name__ == "__main__":
    main(sys.argv[1:])
