"""``slotrunner harness sweep``: find an endpoint's knee without measuring the harness.

``slotrunner`` mounts :data:`harness` through its ``slotrunner.commands`` entry point;
``python -m ops.testing.harness.cli`` runs it through ``slotrunner``.
Exit codes: 0 the sweep ran (invalid runs are marked in the report, not errors),
2 bad usage or an endpoint that cannot be measured (unreachable, 404, 401...): a
:class:`HarnessError`, which the CLI prints as one ``error:`` line.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ops.testing.harness.loop import (
    HarnessError,
    LoadConfig,
    SweepReport,
    api_key_from_env,
    chat_url,
    run_sweep,
)
from runner.cli.common import FiniteFloat

PROGRESS_POLL_S = 0.2


def parse_levels(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; anything but positive integers is a usage error."""
    levels = []
    for token in (t.strip() for t in text.split(",")):
        if not token.isdigit() or int(token) < 1:
            raise click.BadParameter(
                f"{token!r} is not a positive integer", param_hint="--concurrency"
            )
        levels.append(int(token))
    return sorted(set(levels))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render_table(report: SweepReport) -> Table:
    """One row per concurrency: the first-attempt latency beside the 429 + timeout rate."""
    table = Table(title=f"{report.config.mode}-loop sweep of {report.config.url}")
    columns = (
        "C",
        "ok/N",
        "rps",
        "p50 obs",
        "p99 obs",
        "p99 svc",
        "p99 transit",
        "p99 queue",
        "queue share",
        "429",
        "timeouts",
        "429+to rate",
        "retries",
        "p99 retry obs",
        "verdict",
    )
    for name in columns:
        table.add_column(name, justify="right" if name != "verdict" else "left")
    for point, verdict in zip(report.points, report.verdicts, strict=True):
        first = point.first
        mark = " ◀ knee" if point.concurrency == report.knee.concurrency else ""
        table.add_row(
            f"{point.concurrency}{mark}",
            f"{point.prompts - point.failed_prompts}/{point.prompts}",
            f"{point.throughput_rps:.1f}",
            _ms(first.observed_ms.p50),
            _ms(first.observed_ms.p99),
            _ms(first.service_ms.p99),
            _ms(first.transit_ms.p99),
            _ms(first.queue_wait_ms.p99),
            _share(first.queue_share),
            str(point.outcomes["http_429"]),
            str(point.outcomes["timeout"]),
            f"{point.limit_rate:.1%}",
            str(point.retries),
            _ms(point.retry.observed_ms.p99),
            "[green]valid[/]" if verdict.valid else f"[red]INVALID[/] {', '.join(verdict.reasons)}",
        )
    return table


def knee_line(report: SweepReport) -> str:
    knee = report.knee
    if knee.concurrency is None:
        return f"knee: below the sweep ({knee.reason} already at C={knee.seen_at})"
    if knee.seen_at is None:
        return f"knee: not reached (throughput still rising at C={knee.concurrency})"
    return f"knee: C={knee.concurrency} ({knee.reason} at C={knee.seen_at})"


def knee_evidence(report: SweepReport) -> list[str]:
    """What decided the knee, with its numbers, then what was seen and not acted on."""
    knee = report.knee
    lines = [f"  decided by {knee.statistic}: {knee.detail}"] if knee.statistic else []
    return lines + [f"  note: {note}" for note in knee.notes]


def write_plot(report: SweepReport, path: Path) -> None:
    """Throughput and p99 (observed, service) against concurrency, the knee marked."""
    try:
        import matplotlib
    except ImportError:
        raise HarnessError("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")  # no display: write a file only
    import matplotlib.pyplot as plt

    levels = [p.concurrency for p in report.points]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 6))
    top.plot(levels, [p.throughput_rps for p in report.points], "o-", label="throughput")
    top.set_ylabel("completed prompts / s")
    bottom.plot(
        levels,
        [_nan(p.first.observed_ms.p99) for p in report.points],
        "o-",
        label="p99 observed (first attempts)",
    )
    bottom.plot(
        levels,
        [_nan(p.first.service_ms.p99) for p in report.points],
        "s--",
        label="p99 service (endpoint clock)",
    )
    bottom.set_ylabel("ms")
    bottom.set_xlabel("concurrency")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(levels, labels=[str(level) for level in levels])
    invalid = [p for p, v in zip(report.points, report.verdicts, strict=True) if not v.valid]
    if invalid:
        top.plot(
            [p.concurrency for p in invalid],
            [p.throughput_rps for p in invalid],
            "rx",
            markersize=10,
            label="invalid run",
        )
    if report.knee.concurrency is not None:
        for axis in (top, bottom):
            axis.axvline(report.knee.concurrency, color="red", linestyle=":", label="knee")
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    top.set_title(f"{report.config.mode}-loop sweep: {knee_line(report)}")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise HarnessError(f"cannot write --plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _write_json(report: SweepReport, path: Path) -> None:
    try:
        path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    except OSError as exc:
        raise HarnessError(f"cannot write --json-out {path}: {exc.strerror or exc}") from None


def _console() -> Console:
    console = Console(highlight=False)
    # Piped or captured output is not 80 columns of a terminal: keep the table readable.
    return console if console.is_terminal else Console(highlight=False, width=200)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def harness() -> None:
    """Measure an OpenAI-compatible endpoint, not the harness's own queue."""


@harness.command()
@click.option(
    "--url",
    required=True,
    help="Endpoint: http://host:port, .../v1 or the full .../v1/chat/completions URL.",
)
@click.option(
    "--concurrency",
    "levels",
    default="1,2,4,8,16,32",
    show_default=True,
    help="Comma-separated concurrency levels to sweep.",
)
@click.option(
    "--prompts",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Prompts per level (each attempted up to --attempts times).",
)
@click.option(
    "--open-loop",
    is_flag=True,
    help="Send at a fixed --rate instead of when a slot "
    "frees: shows the phantom latency the closed loop avoids.",
)
@click.option(
    "--rate",
    "rate_rps",
    type=FiniteFloat(min=0, min_open=True),
    help="Open loop: requests per second.",
)
@click.option(
    "--timeout-s",
    type=FiniteFloat(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Per-attempt HTTP timeout.",
)
@click.option(
    "--attempts",
    "max_attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Attempts per prompt (first + retries).",
)
@click.option(
    "--max-backoff-s",
    type=FiniteFloat(min=0),
    default=10.0,
    show_default=True,
    help="Cap on a retry's wait, Retry-After included.",
)
@click.option("--model", default="fake-model", show_default=True, help="Model name to send.")
@click.option("--api-key-env", help="Send a bearer key read from this environment variable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds retry jitter.")
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the JSON report here.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG of throughput and p99 against concurrency here.",
)
def sweep(
    url: str,
    levels: str,
    open_loop: bool,
    rate_rps: float | None,
    json_out: Path | None,
    plot: Path | None,
    api_key_env: str | None,
    **knobs: Any,
) -> None:
    """Sweep concurrency upward and report the knee of the endpoint.

    Each run is judged: valid only if p99(queue wait) / p99(observed) < 5 %, it
    completed first attempts, and its concurrency is at or below the knee. Latency
    is first attempts; retries are a separate series; 429s and timeouts are counted.

    The knee is the level before the first 429s, a timeout rate 1 % above the
    smallest level's, or a step that gains under 10 % throughput. A service p99 never
    moves it earlier: it names the reason only at that flat step, and only when its
    95 % bounds separate (under 299 samples at the smallest level cannot bound a p99).
    The report says which statistic decided, and what was seen and not weighed.
    """
    config = LoadConfig(
        url=chat_url(url),
        mode="open" if open_loop else "closed",
        rate_rps=rate_rps,
        api_key=api_key_from_env(api_key_env),
        **knobs,
    )
    report = _run_with_progress(config, parse_levels(levels))
    console = _console()
    console.print(render_table(report))
    console.print(knee_line(report))
    for line in knee_evidence(report):
        console.print(line, markup=False)
    if json_out is not None:
        _write_json(report, json_out)
    if plot is not None:
        write_plot(report, plot)


def _run_with_progress(config: LoadConfig, levels: list[int]) -> SweepReport:
    """The sweep under a progress bar that workers never touch.

    A worker's time between two requests is charged to queue_wait; taking the
    progress bar's lock while it renders would put the display into the measurement.
    Workers only append to a deque (atomic); a poller thread moves the bar.
    """
    finished: deque[None] = deque()
    stop = threading.Event()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("sweep", total=config.prompts * len(levels))

        def poll() -> None:
            while not stop.wait(PROGRESS_POLL_S):
                progress.update(task, completed=len(finished))

        def on_point(level: int) -> None:
            progress.update(task, description=f"{config.mode} loop, C={level}")

        # The first render imports and measures fonts, holding the GIL for ms: do it now,
        # not while the first workers are timing their requests.
        progress.refresh()
        poller = threading.Thread(target=poll, name="harness-progress", daemon=True)
        poller.start()
        try:
            return run_sweep(config, levels, on_point=on_point,
                             on_done=lambda: finished.append(None))  # fmt: skip
        finally:
            stop.set()
            poller.join()


if __name__ == "__main__":
    from runner.cli.main import run_verb

    run_verb("harness", sys.argv[1:])
