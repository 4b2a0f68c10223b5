"""Shared pieces of the ``slotrunner`` CLI: its output, and option types (its errors:
runner.cli.errors)."""

from __future__ import annotations

import json
import math
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
