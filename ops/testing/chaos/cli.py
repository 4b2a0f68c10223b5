"""``slotrunner chaos``: a seeded fault campaign on a real local stack, with a verdict.

Exit 0 when every check passed, 1 when one failed (the report says which), 2 when
the campaign could not run (bad options; a :class:`ChaosError`, such as a stack that
did not start, printed by the CLI as one ``error:`` line).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click
from rich.console import Console

from ops.testing.chaos.plan import ALL_KINDS, HOST_KINDS, KINDS, check_kinds
from runner.cli.common import FiniteFloat
from runner.core.settings import Settings


def _kinds(value: str | None, hosts: int) -> tuple[str, ...]:
    if not value:
        return KINDS if hosts == 1 else ALL_KINDS
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    try:
        check_kinds(kinds, hosts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from None
    return kinds


@click.command()
@click.option("--seed", type=int, required=True, help="Seed of the plan: jobs, faults, places.")
@click.option("--jobs", "n_jobs", type=click.IntRange(1, 500), default=30, show_default=True)
@click.option(
    "--hosts",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Hosts sharing the one Redis, each with its own home, slots, tool server and "
    f"workers; 2 or more add {', '.join(HOST_KINDS)} to the fault kinds.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 8),
    help="Celery workers per host [2 on one host, 1 on each of several].",
)
@click.option(
    "--slots", type=click.IntRange(2, 32), default=4, show_default=True, help="Slots on each host."
)
@click.option(
    "--faults",
    "faults",
    metavar="KIND,...",
    help=f"Only these fault kinds (default: all of {', '.join(KINDS)}; "
    f"with --hosts 2 or more, {', '.join(HOST_KINDS)} too).",
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the report and the run's scratch home go [$SLOTRUNNER_HOME/chaos/<seed>].",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(min=1.0),
    help="Give up waiting for results after this many seconds [120 + 20 a job].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def chaos(
    seed: int,
    n_jobs: int,
    hosts: int,
    workers: int | None,
    slots: int,
    faults: str | None,
    report_dir: Path | None,
    timeout_s: float | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run N scripted jobs under seeded faults and check every invariant afterwards.

    Workers are SIGKILLed around tool calls, the tool server is killed between intent
    and outcome, 429 storms and lost replies hit the wire, copies are redelivered
    while the first runs, a worker is paused past its heartbeat, old envelopes are
    replayed, jobs are cancelled in storms and a receipt fsync fails. Then: ops
    verify and ops detect over the log, terminal states, slots, leaks, generations
    and every succeeded job's final tree.

    With --hosts N the jobs run on N hosts that share one Redis: whole hosts are
    SIGKILLed mid-call (and restarted on their home, or not), and SIGSTOPped past the
    heartbeat until another host took the job over; one host stays up throughout.
    The checks then run over every host's log, slots and processes.
    """
    from ops.testing.chaos.campaign import ChaosConfig, run_campaign
    from ops.testing.chaos.report import render

    kinds = _kinds(faults, hosts)
    directory = report_dir or Settings.from_env().home / "chaos" / str(seed)
    console = Console(highlight=False, stderr=as_json)
    say = (lambda _: None) if quiet or as_json else (lambda line: console.print(line))
    config = ChaosConfig(
        seed=seed,
        jobs=n_jobs,
        report_dir=directory.absolute(),
        workers=workers or (2 if hosts == 1 else 1),
        slots=slots,
        kinds=kinds,
        hosts=hosts,
        timeout_s=timeout_s,
    )
    # SIGTERM unwinds like Ctrl-C, so the campaign stops the stack it started (its
    # workers, tool server and Redis would otherwise outlive it).
    signal.signal(signal.SIGTERM, _terminate)
    report = run_campaign(config, say)
    if as_json:
        click.echo(json.dumps(report.to_json(), default=str))
    else:
        render(report, console if console.is_terminal else Console(width=160, highlight=False))
        console.print(f"report: {directory / 'report.json'}")
    raise SystemExit(0 if report.ok else 1)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
