"""A Celery worker for test stacks: ``python -m ops.testing.worker [options]``.

The same worker as ``slotrunner worker`` (same app factory, settings, queue and
preflight), with the two test options a normally started worker has no way to take,
because they are arguments of ``runner.worker.celery_app.create_app`` and not
environment variables:

    --unacked-restore-s S   kombu restores unacked deliveries past the visibility
                            timeout every S seconds (default: every 100 s), so a
                            short visibility timeout redelivers within seconds
    --no-attempt-floor      run attempts on the Redis counter alone; the chaos
                            campaign's control run, which shows that its check catches
                            the attempt numbers a Redis wipe then reissues
    --faults DIR            obey a fault plan (``ops.testing.faultplan``) armed at run
                            time: EIO on every fsync in the directories it names

``ops.testing.stack.start_worker`` starts this module when a stack asks for either.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ops.testing.faultplan import FaultPlan
from runner.core.settings import Settings


def broker_options(unacked_restore_s: float | None) -> dict[str, Any]:
    """kombu transport options for a restore of unacked deliveries every ``unacked_restore_s``."""
    if unacked_restore_s is None:
        return {}
    # The throttle multiplies the interval; 1 makes the interval the whole period.
    return {"unacked_restore_interval": unacked_restore_s, "unacked_restore_throttle": 1}


@click.command()
@click.option("--concurrency", type=int, default=2, show_default=True)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "solo", "threads"]),
    default="prefork",
    show_default=True,
)
@click.option("--loglevel", default="WARNING", show_default=True)
@click.option("--hostname", default=None, help="Celery node name.")
@click.option("--unacked-restore-s", type=click.FloatRange(min=0.1), default=None)
@click.option("--no-attempt-floor", "no_floor", is_flag=True)
@click.option("--faults", type=click.Path(file_okay=False, path_type=Path), default=None)
def main(
    concurrency: int,
    pool: str,
    loglevel: str,
    hostname: str | None,
    unacked_restore_s: float | None,
    no_floor: bool,
    faults: Path | None,
) -> None:
    """Run a slotrunner worker with test-only broker options or without the attempt floor."""
    from runner.redis_server import connect
    from runner.worker.celery_app import create_app, worker_argv
    from runner.worker.preflight import check_redis

    if faults is not None:
        FaultPlan(faults).take_over_os_fsync()  # before the pool forks: children inherit it
    settings = Settings.from_env()
    for warning in check_redis(connect(settings)):
        click.echo(f"warning: {warning}", err=True)
    app = create_app(
        settings, broker_options=broker_options(unacked_restore_s), attempt_floor=not no_floor
    )
    argv = worker_argv(
        settings, concurrency=concurrency, pool=pool, loglevel=loglevel, hostname=hostname
    )
    app.worker_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
