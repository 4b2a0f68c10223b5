"""Shared pieces of the ``slotrunner`` CLI: one clear error line, never a traceback."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from runner.core.settings import Settings, SettingsError

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True)

EXIT_ERROR = 2


class CliError(click.ClickException):
    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        err_console.print(f"[bold red]error:[/] {self.message}", highlight=False)


def friendly(fn: F) -> F:
    """Turn the project's expected errors into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from redis import RedisError

        from runner.core.stamp import StampError
        from runner.jobs.submit import SpecError
        from runner.redis_server import RedisUnavailable
        from runner.slots.pool import SlotError
        from runner.worker.preflight import PreflightError
        from runner.workspace.git import WorkspaceError

        try:
            return fn(*args, **kwargs)
        except (
            SettingsError,
            SpecError,
            SlotError,
            StampError,
            WorkspaceError,
            PreflightError,
            RedisUnavailable,
        ) as exc:
            raise CliError(str(exc)) from None
        except RedisError as exc:
            raise CliError(f"Redis: {exc}") from None

    return wrapper  # type: ignore[return-value]


def load_settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise CliError(str(exc)) from None


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str))
