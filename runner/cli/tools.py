"""``slotrunner tools table``: the retry table the client really uses."""

from __future__ import annotations

import click

from runner.cli.common import emit_json
from runner.core.settings import Settings


@click.group()
def tools() -> None:
    """Inspect the tool registry and its retry classifier."""


@tools.command("table")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='A JSON list of {"tool","mutating","failure","decision"} rows.',
)
def table(as_json: bool) -> None:
    """Print the retry decision for every tool and failure kind."""
    from rich.console import Console

    from tools import classifier
    from tools.sandbox import run as sandbox

    if as_json:
        emit_json(classifier.table_rows())
        return
    console = Console()
    click.echo(classifier.format_table())
    settings = Settings.from_env()
    if settings.sandbox == "off":
        console.print("sandbox: off (SLOTRUNNER_SANDBOX=off); exec runs UNCONFINED")
    else:
        test = sandbox.self_test()
        state = "confines" if test.ok else "NOT available"
        console.print(f"sandbox ({settings.sandbox}): {state}: {test.detail}", highlight=False)
        if not test.ok:
            # exec never falls back (docs/architecture.md §Exec tool).
            console.print("exec: refused (sandbox_unavailable) until bwrap works", highlight=False)
