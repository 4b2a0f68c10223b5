"""``slotrunner slots list|lease|release``: the operator's view of the slot pool.

``slots list`` shows this host's stamps, read from its disk; ``slots list --pool``
shows every host's slots as they published them to the shared Redis
(``runner/slots/pool_view.py``, docs/architecture.md §Several hosts).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from runner.cli.common import FiniteFloat, emit_json
from runner.core.settings import Settings

if TYPE_CHECKING:  # imported where used: `slotrunner ops detect` need not load the pool
    from runner.core.stamp import Stamp
    from runner.slots.pool import SlotPool
    from runner.slots.pool_view import HostView


def _pool() -> tuple[Settings, SlotPool]:
    from runner.core.logs import EventLog
    from runner.redis_server import connect
    from runner.slots.pool import SlotPool

    settings = Settings.from_env()
    return settings, SlotPool(settings, connect(settings), EventLog(settings))


def _age(stamp: Stamp, now: datetime) -> str:
    if not stamp.leased_at:
        return "-"
    seconds = (now - datetime.fromisoformat(stamp.leased_at)).total_seconds()
    return f"{seconds:.0f}s"


@click.group()
def slots() -> None:
    """Inspect, lease and release this host's workspace slots."""


@slots.command("list")
@click.option(
    "--pool",
    "whole_pool",
    is_flag=True,
    help="Every host's slots, from the shared Redis; hosts whose beat stopped are marked dead.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON list of stamps (--pool: of hosts).")
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@click.option(
    "--interval",
    "interval_s",
    type=FiniteFloat(min=0),
    default=1.0,
    show_default=True,
    help="With --watch: seconds between refreshes.",
)
def list_slots(whole_pool: bool, as_json: bool, watch: bool, interval_s: float) -> None:
    """Every slot with its generation, holder, state, age and lease expiry.

    With --pool: every host's slots (host, slot, generation, job, attempt, state, age)
    as the hosts last published them, each host marked live, dead (its workers' beat
    stopped) or without a heartbeat.
    """
    if whole_pool:
        _list_pool(as_json, watch, interval_s)
        return
    _, pool = _pool()
    pool.ensure_layout()
    if as_json:
        emit_json([s.model_dump() for s in pool.list()])
        return
    _show(lambda: _table(pool.list()), watch, interval_s)


def _list_pool(as_json: bool, watch: bool, interval_s: float) -> None:
    from runner.redis_server import connect
    from runner.slots.pool_view import read_pool

    client = connect(Settings.from_env())
    if as_json:
        emit_json([host.model_dump() for host in read_pool(client, datetime.now(UTC))])
        return
    _show(lambda: _pool_table(read_pool(client, datetime.now(UTC))), watch, interval_s)


def _show(render: Callable[[], Table], watch: bool, interval_s: float) -> None:
    """Print the table once, or with ``watch`` refresh it every ``interval_s`` until Ctrl-C."""
    if not watch:
        Console().print(render())
        return
    import time

    from rich.live import Live

    with Live(render(), refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval_s)
                live.update(render())
        except KeyboardInterrupt:
            pass


def _pool_table(hosts: list[HostView]) -> Table:
    now = datetime.now(UTC)
    caption = f"{now:%H:%M:%S} UTC" if hosts else "no host has published its slots to this Redis"
    table = Table(
        "host", "heartbeat", "slot", "generation", "job", "attempt", "state", "age", caption=caption
    )
    for host in hosts:
        for s in host.slots:
            table.add_row(
                host.host,
                host.heartbeat(),
                s.slot_id,
                "-" if s.generation is None else str(s.generation),
                s.job_id or "-",
                str(s.attempt) if s.attempt else "-",
                s.state + (f" ({s.reason})" if s.reason else ""),
                "-" if s.age_s is None else f"{s.age_s:.0f}s",
            )
        if not host.slots:
            table.add_row(host.host, host.heartbeat(), *["-"] * 6)
    return table


def _table(stamps: list[Stamp]) -> Table:
    now = datetime.now(UTC)
    table = Table(
        "slot",
        "generation",
        "job",
        "attempt",
        "state",
        "age",
        "lease expires",
        caption=f"{now:%H:%M:%S} UTC",
    )
    for s in stamps:
        table.add_row(
            s.slot_id,
            str(s.generation),
            s.job_id or "-",
            str(s.attempt) if s.attempt else "-",
            s.state.value + (f" ({s.reason})" if s.reason else ""),
            _age(s, now),
            s.lease_expires_at or "-",
        )
    return table


@slots.command("lease")
@click.option("--job", "job_id", required=True, help="The job that takes the slot.")
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The job's attempt number.",
)
@click.option("--repo", default=None, help="Prepare the work tree from this repository.")
@click.option("--base", default="HEAD", show_default=True, help="With --repo: the commit-ish.")
@click.option(
    "--wait",
    "wait_s",
    type=FiniteFloat(min=0),
    default=0.0,
    help="Seconds to wait for a free slot.",
)
@click.option(
    "--tool",
    "tool_names",
    multiple=True,
    help="Allow only this tool (repeat for several; default: every tool).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the stamp, token and MCP URL as JSON.")
def lease(
    job_id: str,
    attempt: int,
    repo: str | None,
    base: str,
    wait_s: float,
    tool_names: tuple[str, ...],
    as_json: bool,
) -> None:
    """Lease a free slot to a job (and, with --repo, take its start snapshot).

    Prints the lease's token and the MCP URL an agent uses it at: the token is shown
    once and only its hash is kept.
    """
    from runner.core.ids import JOB_ID_RULE, valid_job_id
    from runner.jobs.models import unknown_tools
    from runner.workspace.workspaces import Workspaces

    if not valid_job_id(job_id):
        raise click.BadParameter(JOB_ID_RULE, param_hint="--job")
    problem = unknown_tools(tool_names)
    if problem:
        raise click.BadParameter(problem, param_hint="--tool")
    settings, pool = _pool()
    stamp = pool.lease(job_id, attempt, wait_s=wait_s, tools=tool_names or None)
    extra = {}
    if repo:
        try:
            prepared = Workspaces(settings.home).prepare(
                settings.slots_dir / stamp.slot_id, repo, base, job_id
            )
        except Exception:
            pool.release(stamp.slot_id, job_id, stamp.generation)
            raise
        extra = {"start_tree": prepared.start_tree, "base_commit": prepared.base_commit}
    if as_json:
        emit_json({**stamp.model_dump(), **extra, "token": stamp.token, "mcp_url": stamp.mcp_url})
    else:
        click.echo(f"{stamp.slot_id} generation {stamp.generation} leased to {job_id}")
        click.echo(f"mcp_url {stamp.mcp_url}")
        click.echo(f"token   {stamp.token}")


@slots.command("release")
@click.option("--slot", "slot_id", required=True, help="The slot to return (S0, S1, ...).")
@click.option("--job", "job_id", required=True, help="The job it is leased to.")
@click.option(
    "--generation", type=int, required=True, help="The lease's generation (see slots list)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the new stamp as JSON.")
def release(slot_id: str, job_id: str, generation: int, as_json: bool) -> None:
    """Return a slot to the pool; refused unless it is leased to JOB at GENERATION."""
    from runner.core.ids import JOB_ID_RULE, valid_job_id

    if not valid_job_id(job_id):
        raise click.BadParameter(JOB_ID_RULE, param_hint="--job")
    _, pool = _pool()
    stamp = pool.release(slot_id, job_id, generation)
    if as_json:
        emit_json(stamp.model_dump())
    else:
        click.echo(f"{slot_id} released (generation {stamp.generation})")
