"""The CLI's one error boundary: whatever escapes a verb becomes one line and an exit code.

A verb raises; it never prints an error or picks an exit code for one. The root group
(:mod:`runner.cli.root`) runs every verb inside :func:`guard`, which decides both.
The exit codes of ``slotrunner`` (docs/architecture.md, §Errors)::

    code  stderr                              when
    0                                         done, and the verdict is good
    1     the verb's own report               done, and the verdict is bad: a job in
                                              another end state (submit --wait,
                                              result), incidents (ops detect),
                                              violations (ops verify), a failed check
                                              (chaos), an unexpected demo outcome
    2     error: <the problem>                a named problem: an error of the runner,
                                              tools or ops packages (RunnerError,
                                              ToolError, OpsError and what derives from
                                              them, CliError included), an OSError, a
                                              Redis error, a record that is not JSON or
                                              fails validation; ops detect/verify:
                                              unusable input
    2     Usage: ... Error: <the problem>     a bad option or argument (click's usage
                                              errors, printed as click prints them)
    3                                         result: the job has not finished
    70    internal error: <Type>: <message>   anything else, which is a bug; the line
                                              says to run with --debug
    128+N                                     stopped by signal N (chaos on SIGTERM)

``slotrunner --debug VERB`` prints the traceback before the line; nothing else does.
Packages that plug verbs in (``slotrunner.commands``) name their error root under the
``slotrunner.errors`` entry points, so the runner catches ops errors without importing
ops. ``hooks.check_apply_envelope`` is not a ``slotrunner`` verb and keeps its own
codes (2-6 refusals, 64-66).
"""

from __future__ import annotations

import errno
import json
import traceback
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TypeVar

import click

from runner.errors import RunnerError

T = TypeVar("T")

EXIT_ERROR = 2
EXIT_PENDING = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h
ERRORS_GROUP = "slotrunner.errors"

# click's own control flow (usage errors, --help's exit, Ctrl-C) is click's to print.
_CLICK = (click.ClickException, click.exceptions.Exit, click.exceptions.Abort)


class CliError(RunnerError):
    """A problem the command line itself names: an unknown job, an unreadable spec file.

    Raised ``from`` another exception, its line says what the CLI was doing, then what
    went wrong: ``error: the stored result of job 'x' is corrupt: not JSON: ...``.
    """


def guard(invoke: Callable[[], T], *, debug: bool) -> T:
    """``invoke()``, with any exception it raises turned into one line on stderr and an exit."""
    try:
        return invoke()
    except _CLICK:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            raise  # a reader that went away (`| head`): click closes stdout quietly
        code, line = describe(exc)
        if debug:
            click.echo("".join(traceback.format_exception(exc)), err=True, nl=False)
        click.echo(line, err=True)
        raise SystemExit(code) from None


def describe(exc: Exception) -> tuple[int, str]:
    """The exit code and the one line for ``exc``."""
    problem = _problem(exc)
    if problem is not None:
        return EXIT_ERROR, f"error: {_one_line(problem)}"
    text = _one_line(str(exc))
    what = f"{type(exc).__qualname__}: {text}" if text else type(exc).__qualname__
    return EXIT_INTERNAL, f"internal error: {what} (run with --debug for the traceback)"


def _problem(exc: Exception) -> str | None:
    from pydantic import ValidationError
    from redis.exceptions import RedisError

    if isinstance(exc, RedisError):
        return f"Redis: {exc}"
    if isinstance(exc, OSError):  # DurabilityError too: its strerror says what failed
        text = exc.strerror or str(exc) or type(exc).__name__
        if exc.filename is not None:
            where = str(exc.filename)
            if exc.filename2 is not None:
                where += f" -> {exc.filename2}"
            return f"{where}: {text}"
        return text
    if isinstance(exc, ValidationError):
        fields = "; ".join(
            (".".join(map(str, e["loc"])) + ": " if e["loc"] else "") + e["msg"]
            for e in exc.errors()
        )
        return f"invalid {exc.title}: {fields}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc}"
    if isinstance(exc, CliError) and isinstance(exc.__cause__, Exception):
        cause = _problem(exc.__cause__) or _one_line(str(exc.__cause__))
        return f"{exc}: {cause}" if cause else str(exc)
    if isinstance(exc, _roots()):
        return str(exc) or type(exc).__name__
    return None


def _roots() -> tuple[type[BaseException], ...]:
    from tools.errors import ToolError

    roots: list[type[BaseException]] = [RunnerError, ToolError]
    for point in entry_points(group=ERRORS_GROUP):
        try:
            root = point.load()
        except Exception:  # a broken plug-in must not hide the error being reported
            continue
        if isinstance(root, type) and issubclass(root, BaseException):
            roots.append(root)
    return tuple(roots)


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())
