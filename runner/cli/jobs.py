"""``slotrunner cancel``: ask a job to stop, and say what happened. ``slotrunner republish``:
put this host's kept results back into a Redis that lost them."""

from __future__ import annotations

import sys

import click

from runner.cli.common import emit_json
from runner.cli.errors import EXIT_ERROR, CliError
from runner.core.settings import Settings


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print what happened as one JSON object.")
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel JOB_ID: a queued job ends 'cancelled' at once, without a slot; a running
    one stops before its next step (its current tool call finishes), releases its
    slot and ends 'cancelled'. Repeating it is harmless.

    Prints one of: cancel requested, cancelled before it started, already finished:
    <state>, unknown job. Exit 0, or 2 for an unknown job.
    """
    from runner.core import events
    from runner.core.ids import JOB_ID_RULE, valid_job_id
    from runner.core.logs import EventLog
    from runner.jobs import events as job_events
    from runner.jobs.cancel import CancelOutcome
    from runner.jobs.cancel import cancel as request_cancel
    from runner.redis_server import connect

    if not valid_job_id(job_id):
        raise CliError(f"{job_id!r} is not a job id ({JOB_ID_RULE})")
    settings = Settings.from_env()
    report = request_cancel(connect(settings), job_id)
    if report.outcome in (CancelOutcome.CANCEL_REQUESTED, CancelOutcome.CANCELLED):
        log = EventLog(settings)
        log.emit(
            job_events.JOB_CANCEL_REQUESTED,
            job_id=job_id,
            outcome=report.outcome.value,
            repeated=report.repeated,
        )
        if report.outcome == CancelOutcome.CANCELLED:
            log.emit(
                events.JOB_FINISHED,
                job_id=job_id,
                attempt=0,
                state="cancelled",
                committed=True,
                reason="cancelled before it started",
            )
    if as_json:
        emit_json(report.as_dict())
        if report.outcome == CancelOutcome.UNKNOWN_JOB:
            sys.exit(EXIT_ERROR)
        return
    if report.outcome == CancelOutcome.UNKNOWN_JOB:
        raise CliError(f"unknown job {job_id!r}: no job of that id is known to this Redis")
    click.echo(report.message())


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was done as one JSON object.")
def republish(as_json: bool) -> None:
    """Put back into Redis every job result this host committed, where Redis has none.

    After Redis lost its data (a restart without persistence, a flush), run it on every
    host, then submit again the jobs that still have no result. A host keeps a copy of
    each result it committed ($SLOTRUNNER_HOME/results/); its own workers already put
    one back when a job comes to them again, but a job committed on one host and
    resubmitted to another would otherwise run there a second time. A result that is
    in Redis is never overwritten; running it twice is harmless.

    Exit 0, or 1 when a kept copy cannot be read (it is named; the others go back).
    """
    from runner.jobs.result_copy import republish_all
    from runner.redis_server import connect

    settings = Settings.from_env()
    done = republish_all(connect(settings), settings.home)
    if as_json:
        emit_json({"home": str(settings.home), **done.as_dict()})
    else:
        click.echo(
            f"{len(done.put_back)} result(s) put back, {len(done.present)} already in Redis,"
            f" {len(done.unusable)} unreadable (from {settings.home / 'results'})"
        )
        for job_id in done.put_back:
            click.echo(f"  put back: {job_id}")
        for job_id, why in done.unusable.items():
            click.echo(f"  unreadable: {job_id}: {why}", err=True)
    if done.unusable:
        sys.exit(1)
