"""``slotrunner``: one command, many verbs. Errors are one clear line (runner.cli.errors)."""

from __future__ import annotations

import sys

import click

from runner.cli.common import FiniteFloat, emit_json, err_console, read_json_file
from runner.cli.errors import EXIT_PENDING, CliError
from runner.cli.root import RootGroup
from runner.core.settings import Settings


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slotrunner")
@click.option(
    "--debug", is_flag=True, help="On an error, print its traceback before the one-line summary."
)
def main(debug: bool) -> None:
    """Run LLM-agent jobs on Celery in generation-stamped workspace slots.

    Settings come from the environment: REDIS_URL (default: an embedded Redis under
    $SLOTRUNNER_HOME), SLOTRUNNER_HOME (default ./.slotrunner), SLOTRUNNER_SLOTS,
    SLOTRUNNER_TOOLSERVER_URL, SLOTRUNNER_GATEWAY_URL, SLOTRUNNER_LEASE_TTL_S,
    SLOTRUNNER_TOKEN, SLOTRUNNER_SANDBOX (required|auto|off).

    Exit codes: 0 done (verdict good), 1 done (verdict bad: a job failed, incidents,
    violations), 2 an error named on one line or bad usage, 3 a job not finished
    (result), 70 an internal error (--debug shows its traceback).
    """


@main.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--wait", is_flag=True, help="Wait for the job(s) to finish and print the result.")
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(),
    default=600.0,
    show_default=True,
    help="With --wait: give up after this many seconds.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(spec_file: str, wait: bool, timeout_s: float, as_json: bool) -> None:
    """Validate SPEC_FILE (a job spec, or a list of them; - for stdin) and enqueue it.

    Nothing is enqueued unless every spec in the file is valid. Exit 0 enqueued (with
    --wait: every job succeeded), 1 with --wait: a job ended in another state, 2 a
    file or spec that cannot be used, or jobs still running at --timeout.
    """
    from runner.jobs.submit import SpecError, parse_spec, wait_for
    from runner.jobs.submit import submit as enqueue
    from runner.redis_server import connect
    from runner.worker.celery_app import create_app

    data = read_json_file(spec_file)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise CliError(f"{spec_file} holds no job spec")
    specs = []
    for number, item in enumerate(items, 1):
        try:
            specs.append(parse_spec(item))
        except SpecError as exc:
            where = f" (spec {number})" if len(items) > 1 else ""
            raise CliError(f"{exc}{where}; nothing was enqueued") from None
    settings = Settings.from_env()
    app = create_app(settings)
    client = connect(settings)
    jobs = [enqueue(app, client, spec) for spec in specs]
    ids = [job.job_id for job in jobs if job.job_id]
    if not wait:
        if as_json:
            emit_json({"job_ids": ids})
        else:
            for job_id in ids:
                click.echo(job_id)
        return
    results = wait_for(client, ids, timeout_s)
    if as_json:
        emit_json(
            [
                results[i].model_dump() if i in results else {"job_id": i, "state": "pending"}
                for i in ids
            ]
        )
    else:
        for job_id in ids:
            state = results[job_id].state if job_id in results else "still running"
            click.echo(f"{job_id}\t{state}")
    if len(results) < len(ids):
        raise CliError(f"{len(ids) - len(results)} job(s) did not finish within {timeout_s:g}s")
    if any(r.state != "succeeded" for r in results.values()):
        sys.exit(1)


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def result(job_id: str, as_json: bool) -> None:
    """Show a job's result. Exit 0 succeeded, 1 another end state, 3 not finished
    (a running job's phase, such as building its environment, is shown)."""
    from runner.core import keys
    from runner.core.ids import JOB_ID_RULE, valid_job_id
    from runner.jobs.results import load_result
    from runner.redis_server import connect

    if not valid_job_id(job_id):  # it names Redis keys: none of another shape exists
        raise CliError(f"{job_id[:200]!r} is not a job id ({JOB_ID_RULE})")
    client = connect(Settings.from_env())
    try:
        found = load_result(client, job_id)
    except ValueError as exc:  # not JSON, or not a JobResult: the stored bytes are damaged
        raise CliError(f"the stored result of job {job_id!r} is corrupt") from exc
    if found is None:
        raw = client.get(keys.job_state(job_id))
        state = raw.decode() if isinstance(raw, bytes) else raw
        if state is None:
            raise CliError(f"no job {job_id!r} is known to this Redis")
        shown: dict[str, str | None] = {"job_id": job_id, "state": state}
        if state == "running":  # maybe still building its environment (runner.worker.environment)
            raw = client.get(keys.job_phase(job_id))
            shown["phase"] = raw.decode() if isinstance(raw, bytes) else raw
        if as_json:
            emit_json(shown)
        else:
            phase = f" ({shown['phase']})" if shown.get("phase") else ""
            click.echo(f"{job_id}: {state}{phase}")
        sys.exit(EXIT_PENDING)
    if as_json:
        emit_json(found.model_dump())
    else:
        c = found.counts
        click.echo(
            f"{found.job_id}: {found.state} (attempt {found.attempt}, slot {found.slot_id}"
            f" generation {found.generation})"
        )
        if found.reason:
            click.echo(f"  reason: {found.reason}")
        if found.state == "rejected":
            from runner.jobs.backpressure import rejection_counts

            counts = ", ".join(f"{k} {v}" for k, v in rejection_counts(client).items())
            click.echo(f"  jobs rejected so far on this Redis: {counts}")
        click.echo(f"  final_tree {found.final_tree}")
        click.echo(
            f"  tool calls {c.tool_calls}, retries {c.retries}, stale rejects "
            f"{c.stale_rejects}, replayed {c.replayed}, receipts {c.receipts}"
        )
    sys.exit(0 if found.state == "succeeded" else 1)


@main.command()
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "solo", "threads"]),
    default="prefork",
    show_default=True,
    help="Celery execution pool.",
)
@click.option("--loglevel", default="WARNING", show_default=True, help="Celery's log level.")
@click.option(
    "--hostname",
    default=None,
    help="Celery node name (default: slotrunner-<SLOTRUNNER_HOST_ID>@<hostname>).",
)
def worker(concurrency: int, pool: str, loglevel: str, hostname: str | None) -> None:
    """Run a Celery worker that executes agent jobs on this host's slots."""
    from runner.jobs.queue import QUEUE
    from runner.redis_server import connect
    from runner.worker.celery_app import create_app
    from runner.worker.preflight import check_redis

    settings = Settings.from_env()
    for warning in check_redis(connect(settings)):
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    app = create_app(settings)
    argv = [
        "worker",
        "-Q",
        QUEUE,
        "--concurrency",
        str(concurrency),
        "--pool",
        pool,
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
        "-n",
        hostname or f"slotrunner-{settings.host}@%h",
    ]
    app.worker_main(argv)


@main.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; off loopback SLOTRUNNER_TOKEN is required.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port (default: from SLOTRUNNER_TOOLSERVER_URL).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Executions at once; beyond that, 429 with Retry-After.",
)
def toolserver(host: str, port: int | None, max_concurrent: int) -> None:
    """Serve this host's slots to the workers over HTTP."""
    from urllib.parse import urlparse

    from tools.server.app import is_loopback, serve

    settings = Settings.from_env()
    port = port or urlparse(settings.toolserver_url).port or 8765
    if is_loopback(host) or settings.token:  # otherwise serve() refuses to start at all
        _check_bindable(host, port)
    serve(settings, host=host, port=port, max_concurrent=max_concurrent)


def _check_bindable(host: str, port: int) -> None:
    """A port that cannot be bound as one ``error:`` line: uvicorn would log it in its
    own format and exit 3, the code of a job not finished. The probe binds as uvicorn
    does (SO_REUSEADDR) and never listens, so it accepts nothing."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise CliError(f"cannot bind {host}:{port}") from exc


def _mount() -> None:
    # The runner's own verbs; ops, demo, chaos, harness and fake-endpoint come in
    # through the entry points RootGroup reads (runner must not import ops).
    from runner.cli.envs import envs
    from runner.cli.gateway import gateway
    from runner.cli.jobs import cancel, republish
    from runner.cli.slots import slots
    from runner.cli.tools import tools

    main.add_command(cancel)
    main.add_command(envs)
    main.add_command(gateway)
    main.add_command(republish)
    main.add_command(slots)
    main.add_command(tools)


_mount()


def run_verb(name: str, args: list[str]) -> None:
    """Run ``slotrunner NAME ARGS``: a package's ``python -m`` entry, with the same errors."""
    main([name, *args], prog_name="slotrunner")


if __name__ == "__main__":
    main()
