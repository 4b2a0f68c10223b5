"""How the ``slotrunner ops`` verbs print: a console sized for a pipe, one JSON object
a line, and an incident as a table row (ops/cli.py, ops/verify_cli.py)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.text import Text

from ops.detect.detector import Incident

COLUMNS = ("kind", "where", "host", "slot", "gen", "job", "tool", "key", "ts")


def console() -> Console:
    found = Console(highlight=False)
    return found if found.is_terminal else Console(highlight=False, width=220)


def json_line(obj: object) -> None:
    click.echo(json.dumps(obj))


def row(i: Incident) -> tuple[Text, ...]:
    # Text, not str: a key or job id with [brackets] must not be read as rich markup.
    return tuple(map(Text, cells(i)))


def cells(i: Incident) -> tuple[str, ...]:
    return (
        i.kind,
        f"{i.path}:{i.line}",
        i.host,
        i.slot_id,
        str(i.generation),
        i.job_id,
        i.tool,
        i.idempotency_key,
        i.ts,
    )
