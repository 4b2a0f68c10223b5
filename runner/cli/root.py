"""The ``slotrunner`` root group: the runner's own verbs, plus those other packages plug in.

Every verb runs inside :func:`runner.cli.errors.guard`, the CLI's one error boundary,
with the root's ``--debug`` flag.

``runner`` never imports the packages built on it. A package adds a verb by naming a
click command under the entry-point group :data:`COMMANDS_GROUP` in its
``pyproject.toml``; the root group lists those names and imports a command only
when it is run or its help is shown, so ``slotrunner result`` loads none of them.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

from runner.cli.errors import guard

COMMANDS_GROUP = "slotrunner.commands"


class RootGroup(click.Group):
    """A click group of its own commands plus the entry points of :data:`COMMANDS_GROUP`,
    each run inside the one error boundary."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._loaded: dict[str, click.Command] = {}

    def _plugins(self) -> dict[str, EntryPoint]:
        # Several copies of the metadata (an editable install beside an egg-info) may
        # name one verb twice; the first on sys.path wins, as it does for imports.
        found: dict[str, EntryPoint] = {}
        for point in entry_points(group=COMMANDS_GROUP):
            found.setdefault(point.name, point)
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        if cmd_name not in self._loaded:
            point = self._plugins().get(cmd_name)
            if point is None:
                return None
            self._loaded[cmd_name] = _load(point)
        return self._loaded[cmd_name]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # No command line can carry a NUL (argv is C strings), so only an in-process
        # caller can pass one; every path, host and name would raise on it somewhere
        # deep in the verb. Refused here, once, for every verb.
        for arg in args:
            if "\x00" in arg:
                raise click.UsageError(f"argument {arg!r} holds a NUL character", ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        # The root's own options are parsed by now; a verb's are parsed in here, so a
        # bad one is still click's usage error, printed as click prints it.
        return guard(lambda: super(RootGroup, self).invoke(ctx), debug=bool(ctx.params["debug"]))


def _load(point: EntryPoint) -> click.Command:
    command = point.load()
    if not isinstance(command, click.Command):
        raise TypeError(
            f"entry point {point.name} = {point.value} in {COMMANDS_GROUP} is not a click command"
        )
    return command
