"""Shared pieces of the ``slotrunner`` CLI's output (its errors: runner.cli.errors)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console

err_console = Console(stderr=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str))
