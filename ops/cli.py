"""``slotrunner ops``: find incidents in the event logs, and prove the invariants over them.

Exit codes: 0 clean, 1 incidents (detect) or violations (verify), 2 unusable input
(no such file, unreadable, not a log at all), bad usage or another error (one
``error:`` line, from runner.cli.errors). Unusable input wins over incidents: the
verdict is incomplete; the incidents found are still reported. ``slotrunner`` mounts
:data:`ops` through its ``slotrunner.commands`` entry point; ``python -m ops.cli``
runs the same verbs through it.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.text import Text

from ops.detect.detector import (
    DETECT_KINDS,
    Incident,
    KeySet,
    Malformed,
    Replay,
    Tally,
    expected_keys,
    judge_batches,
    read_batches,
)
from ops.pool import PoolBrake
from ops.render import COLUMNS as _COLUMNS
from ops.render import cells as _cells
from ops.render import console as _console
from ops.render import json_line as _json_line
from ops.render import row as _row
from runner.cli.errors import CliError
from runner.core.settings import Settings

if TYPE_CHECKING:  # imported where used: a one-shot detect loads no HTTP client
    from ops.page import Pager

PAGE_BATCH = 256  # incidents per page call in a one-shot run (the first goes alone, at once)
RETRY_GAP_S = 10.0  # after a failed delivery, wait this long unless new incidents arrive


class Report:
    """Where findings go: one JSON object per line as they come, or a table at the end."""

    def __init__(self, as_json: bool, live: bool = False) -> None:
        self.as_json, self.live = as_json, live
        self.console = _console()
        self.counts: Counter[str] = Counter()
        self._rows: list[Incident] = []

    def item(self, item: Incident | Malformed) -> None:
        if isinstance(item, Incident):
            self.counts[item.kind] += 1
        if self.as_json:
            _json_line(item.to_json())
        elif isinstance(item, Incident):
            if self.live:
                self.console.print(
                    Text("INCIDENT ", style="bold red") + Text("  ".join(_cells(item)))
                )
            else:
                self._rows.append(item)

    def summary(self, lines: int, malformed: int, kinds: Sequence[str]) -> None:
        incidents = {k: self.counts[k] for k in kinds}
        if self.as_json:
            _json_line(
                {"kind": "summary", "lines": lines, "malformed": malformed, "incidents": incidents}
            )
            return
        if self._rows:
            from rich.table import Table

            table = Table(*_COLUMNS, title="incidents", title_justify="left")
            for incident in self._rows:
                table.add_row(*_row(incident))
            self.console.print(table)
        found = ", ".join(f"{k} {n}" for k, n in incidents.items() if n) or "none"
        self.console.print(f"{lines} lines read, {malformed} malformed; incidents: {found}")


class Responder:
    """What an incident sets off beyond the report: the pool brake, then the page."""

    def __init__(
        self,
        pager: Pager | None,
        brake: PoolBrake | None,
        clock: Callable[[], float] = time.monotonic,
        *,
        live: bool = False,
    ) -> None:
        self.pager, self.brake, self._clock = pager, brake, clock
        self._retry_at = 0.0
        self.failed = False
        # Following, each failed delivery is said when it happens; a one-shot run says
        # only the last, once, at its end (one line, however many batches it paged).
        self.live = live
        self.last_error = ""

    def __call__(self, incidents: list[Incident]) -> None:
        note = None
        if incidents and self.brake is not None:
            first = self.brake.note is None
            note = self.brake.pull()
            if first:
                click.echo(note, err=True)
        if self.pager is None:
            return
        fresh = self.pager.enqueue(incidents, note)
        if not self.pager.pending or (not fresh and self._clock() < self._retry_at):
            return
        from ops.page import PageError

        try:
            self.pager.deliver()
            self.failed = False
        except PageError as exc:
            self.failed = True
            self._retry_at = self._clock() + RETRY_GAP_S
            self.last_error = f"{exc} ({self.pager.pending} alerts kept to retry)"
            if self.live:
                click.echo(f"error: {self.last_error}", err=True)


class _Verbs(click.Group):
    """The ops verbs; ``receipts`` and ``verify`` load their modules only when named, so
    a one-shot ``ops detect`` imports no receipt models (a third of its start-up)."""

    LAZY = {"receipts": "ops.receipts:receipts", "verify": "ops.verify_cli:verify"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, attr = self.LAZY[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(name="ops", cls=_Verbs)
def ops() -> None:
    """Find incidents in slotrunner's event logs and check the invariants over them."""


@ops.command()
@click.argument("paths", nargs=-1)
@click.option("--follow", is_flag=True, help="Keep reading as the logs grow (rotation-safe).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--webhook", metavar="URL", help="Page here (Alertmanager /api/v2/alerts body).")
@click.option("--stop-pool", is_flag=True, help="On the first incident, cancel the consumers.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Offsets, timelines, page log [$SLOTRUNNER_HOME/detector].",
)
def detect(
    paths: tuple[str, ...],
    follow: bool,
    as_json: bool,
    webhook: str | None,
    stop_pool: bool,
    state_dir: Path | None,
) -> None:
    """Report cross-job, stale-generation, unowned and duplicate applies in PATH... (files,
    globs, .gz, - for stdin; default: this host's log). Exit 0 clean, 1 incidents, 2 unusable."""
    if webhook and not _http_url(webhook):
        raise click.BadParameter(
            f"{webhook!r}: expected an http:// or https:// URL", param_hint="--webhook"
        )
    if follow and "-" in paths:
        raise click.UsageError("--follow reads files; stdin cannot be followed")
    inputs = list(paths) if paths else [str(Settings.from_env().log_path)]
    if state_dir is None and (follow or webhook):
        state_dir = Settings.from_env().home / "detector"
    try:
        pager = _pager(webhook, state_dir) if webhook and state_dir else None
    except OSError as exc:
        raise CliError(f"--state-dir {state_dir}") from exc
    brake = PoolBrake(_broker_url) if stop_pool else None
    respond = Responder(pager, brake, live=follow)
    try:
        if follow:
            assert state_dir is not None
            code = _follow(inputs, state_dir, as_json, respond)
        else:
            code = _scan(inputs, as_json, respond)
    finally:
        if pager is not None:
            pager.close()
    if respond.failed:
        last = "" if follow else f": {respond.last_error}"
        click.echo(f"error: some pages were not delivered{last}", err=True)
    raise SystemExit(code)


def _http_url(text: str) -> bool:
    import httpx  # only when a webhook is given

    try:
        url = httpx.URL(text)
    except httpx.InvalidURL:  # "http://[::1": a scheme, and no URL
        return False
    return url.scheme in ("http", "https") and bool(url.host)


def _pager(webhook: str, state_dir: Path) -> Pager:
    from ops.page import Pager

    return Pager(webhook, state_dir)


def _broker_url() -> str:
    from runner.redis_server import resolve_url  # only when the brake is pulled

    return resolve_url(Settings.from_env())


def _scan(inputs: list[str], as_json: bool, respond: Responder) -> int:
    report = Report(as_json)
    batches, tallies = read_batches(inputs)
    batch: list[Incident] = []
    for item in judge_batches(batches, Replay(KeySet(expected=expected_keys(tallies)))):
        report.item(item)
        if isinstance(item, Incident):
            batch.append(item)
            if len(batch) >= PAGE_BATCH or sum(report.counts.values()) == 1:
                respond(batch)
                batch = []
    respond(batch)
    report.summary(sum(t.lines for t in tallies), sum(t.malformed for t in tallies), DETECT_KINDS)
    return _exit_code(tallies, report)


def _exit_code(tallies: list[Tally], report: Report) -> int:
    for tally in tallies:
        if tally.problem is not None:
            click.echo(f"error: {tally.label}: {tally.problem}", err=True)
    if any(t.problem is not None for t in tallies):
        return 2
    return 1 if report.counts else 0


def _follow(inputs: list[str], state_dir: Path, as_json: bool, respond: Responder) -> int:
    report = Report(as_json, live=True)

    def sink(items: list[Incident | Malformed]) -> None:
        for item in items:
            report.item(item)
        respond([i for i in items if isinstance(i, Incident)])

    def warn(message: str) -> None:
        click.echo(f"warning: {message}", err=True)

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from ops.detect.follow import Follower

    follower = Follower(inputs, state_dir, sink, warn=warn)
    try:
        follower.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()
    report.summary(follower.lines, follower.malformed, DETECT_KINDS)
    return 1 if report.counts else 0


@ops.command()
@click.argument("job_id")
@click.option(
    "--which",
    type=click.Choice(["start", "end"]),
    default="start",
    show_default=True,
    help="Which snapshot of the job to put back.",
)
@click.option(
    "--to",
    "to",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write into this new or empty directory instead of the job's slot.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Overwrite a slot another live job holds (only once the pool is stopped).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def restore(job_id: str, which: str, to: Path | None, force: bool, as_json: bool) -> None:
    """Put JOB_ID's snapshot back (into its slot, or --to DIR) and verify the tree id.

    Receipts and logs are left as they are, for audit."""
    from ops.restore import restore as do_restore

    done = do_restore(
        Settings.from_env(),
        job_id,
        which=which,
        to=to,
        force=force,
        broker_url=_broker_url() if force else None,
    )
    if as_json:
        _json_line(
            {
                "job_id": done.job_id,
                "which": done.which,
                "target": done.target,
                "tree": done.tree,
                "commit": done.commit,
                "slot_id": done.slot_id,
            }
        )
    else:
        click.echo(f"restored {done.which} snapshot of {done.job_id} into {done.target}")
        click.echo(f"tree {done.tree} verified")


def main() -> None:
    """``python -m ops.cli ARGS`` runs ``slotrunner ops ARGS``: the same errors and codes."""
    from runner.cli.main import run_verb

    run_verb("ops", sys.argv[1:])


if __name__ == "__main__":
    main()
