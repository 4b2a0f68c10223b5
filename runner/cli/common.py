"""Shared pieces of the ``slotrunner`` CLI: its output, and option types (its errors:
runner.cli.errors)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

err_console = Console(stderr=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str))


class FiniteFloat(click.FloatRange):
    """A float range without ``nan`` and ``inf``. click's FloatRange takes both (every
    comparison with ``nan`` is false, so no bound refuses it), and a wait, a timeout, a
    sleep or a rate of either hangs forever or raises deep inside the verb. Here both
    are usage errors."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def read_json_file(path: str) -> Any:
    """The JSON in ``path`` (``-``: standard input), or a one-line :class:`CliError`."""
    from runner.cli.errors import CliError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{path} is not a job spec: its JSON nests too deeply") from None
