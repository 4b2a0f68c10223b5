"""``slotrunner envs list|build|rm``: this host's job environments, for operators.

A job's ``environment`` block is built once per key on each host, under
``$SLOTRUNNER_HOME/envs``, and evicted least-recently-used past
``SLOTRUNNER_ENVS_MAX_GB`` (docs/architecture.md §Environments; ``runner.envs``).
These verbs are the operator's view of that store: see what is there and how big,
build a spec's environment ahead of its jobs (so the first job does not pay for the
setup, and a broken setup shows up before any job is queued), and remove one by
hand. Removal goes through the store's own locks, so an environment a running job
holds, or one being built, is refused rather than pulled from under it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import click

from runner.cli.common import emit_json, err_console, read_json_file
from runner.cli.errors import CliError
from runner.core.settings import Settings

if TYPE_CHECKING:
    from rich.table import Table

    from runner.envs.store import EnvInfo, EnvStore
    from runner.jobs.models import JobSpec

# Recorded as the builder in the environment's meta.json and build.log.
BUILT_BY = "slotrunner-envs-build"


def _store(settings: Settings) -> EnvStore:
    from runner.envs.store import GB, EnvStore

    return EnvStore(settings.home, max_bytes=int(settings.envs_max_gb * GB))


@click.group()
def envs() -> None:
    """Inspect, build and remove this host's job environments.

    A job spec's "environment" block is built once per key (source, base tree or
    key files, setup, network) under $SLOTRUNNER_HOME/envs and shown read-only to the
    job's run_tests and exec. The least recently used are evicted past
    SLOTRUNNER_ENVS_MAX_GB (default 20).
    """


# -- list -------------------------------------------------------------------------


@envs.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of environments.")
def list_envs(as_json: bool) -> None:
    """Every environment of this host: key, state, size, last use, build time, repo.

    States: ready (usable), failed (its last build failed; the next job of the key
    builds again), building (a build holds its lock), incomplete (a build that
    stopped half-way; rebuilt when next needed).
    """
    from rich.console import Console

    settings = Settings.from_env()
    store = _store(settings)
    infos = store.all()
    if as_json:
        emit_json([info.as_json() for info in infos])
        return
    if not infos:
        click.echo(f"no environments on this host ({store.dir})")
        return
    console = Console()
    console.print(_table(infos, settings))
    for info in infos:  # what failed, under the table: too long for a cell
        why = _failure(info)
        if why:
            console.print(f"{info.key} failed: {why}", highlight=False, markup=False)


def _table(infos: list[EnvInfo], settings: Settings) -> Table:
    from rich import box
    from rich.filesize import decimal
    from rich.table import Column, Table
    from rich.text import Text

    total = sum(info.size_bytes for info in infos)
    table = Table(
        Column("key", no_wrap=True, min_width=24),  # whole: it is what `envs rm` takes
        Column("state", no_wrap=True),
        Column("size", no_wrap=True),
        Column("last used", no_wrap=True),
        Column("build", no_wrap=True),
        Column("repo", overflow="fold"),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption=f"{decimal(total)} of {settings.envs_max_gb:g} GB (SLOTRUNNER_ENVS_MAX_GB)",
        caption_justify="left",
    )
    now = time.time()
    for info in infos:
        build_s = info.meta.get("build_s")
        table.add_row(
            info.key,
            f"{info.state}, in use" if info.in_use else info.state,
            decimal(info.size_bytes),
            _ago(info.last_used, now),
            f"{build_s:.1f}s" if isinstance(build_s, int | float) else "-",
            Text(str(info.meta.get("repo") or "-")),
        )
    return table


def _failure(info: EnvInfo) -> str | None:
    """What failed in a failed build: its error without the output's tail."""
    error = info.meta.get("error") if info.state == "failed" else None
    if not isinstance(error, str):
        return None
    first = error.split("; output tail:", 1)[0].removeprefix("environment setup failed: ")
    return " ".join(first.split()) or "the setup failed"


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    seconds = max(0.0, now - at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


# -- build ------------------------------------------------------------------------


@envs.command("build")
@click.argument("spec_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
def build_env(spec_file: str, as_json: bool) -> None:
    """Build (or find) the environment of SPEC_FILE's job on this host (- for stdin).

    SPEC_FILE is a job spec as `slotrunner submit` takes it, with an "environment"
    block; its repo is cloned or fetched and its base resolved as a job's would be.
    Progress goes to stderr. Exit 0 built or reused, 1 a setup command failed (its
    output's tail is printed; `envs list` shows it failed), 2 a spec, repo or base
    that cannot be used.
    """
    from runner.envs.build import EnvSetupFailed, Ready, ensure, plan
    from runner.workspace.cache import mirror_of
    from runner.workspace.source import parse_source
    from runner.workspace.workspaces import Workspaces

    spec = _read_spec(spec_file)
    if spec.environment is None:
        raise CliError(f"{spec_file}: the job spec has no environment block: nothing to build")
    settings = Settings.from_env()
    caches = Workspaces(settings.home).caches
    store = _store(settings)
    with _progress(f"resolving {spec.repo} at {spec.base}") as phase:
        src = parse_source(spec.repo)
        cache = caches.cache_path(src)
        with caches.lock(cache):
            cache, fresh = caches.ensure_cache(src)
            base_commit = caches.resolve_base(cache, spec.repo, spec.base, fresh)
            caches.keep_base(cache, base_commit)
        planned = plan(
            settings,
            spec.environment,
            repo=spec.repo,
            source_key=src.key,
            mirror=mirror_of(cache),
            base_commit=base_commit,
        )
        if planned.warning:
            err_console.print(f"[yellow]warning:[/] {planned.warning}", highlight=False)
        ready: Ready | None = None
        failed = ""
        try:
            ready = ensure(store, planned, job_id=BUILT_BY, phase=phase)
        except EnvSetupFailed as exc:
            failed = str(exc)
    if ready is None:  # the spinner is gone: the tail is printed on a clean stderr
        log = store.log_path(planned.id)
        if as_json:
            emit_json({"key": planned.id, "state": "failed", "error": failed, "log": str(log)})
        else:
            click.echo(failed.rstrip("\n"), err=True)
            click.echo(f"build log: {log}", err=True)
        sys.exit(1)
    try:
        if as_json:
            emit_json(
                {
                    **ready.summary(),
                    "state": "ready",
                    "repo": spec.repo,
                    "base_commit": base_commit,
                    "where": planned.where,
                    "mount": ready.mount,
                    "path": str(store.env_dir(ready.key)),
                }
            )
            return
        took = f"{ready.build_s:.1f}s" if ready.build_s is not None else "an unknown time"
        if ready.built:
            click.echo(f"environment {ready.key} built (setup took {took})")
        else:
            click.echo(f"environment {ready.key} reused (built earlier, setup took {took})")
        click.echo(f"  path {store.env_dir(ready.key)}")
        click.echo(f"  log  {ready.log}")
    finally:
        ready.close()


@contextlib.contextmanager
def _progress(first: str) -> Iterator[Callable[[str], None]]:
    """A phase callback: a spinner on a terminal's stderr (from ``first`` on), else one
    line per phase of the build (none before it: a spec whose repo or base cannot be
    used stays one ``error:`` line)."""
    if not err_console.is_terminal:
        yield lambda text: click.echo(text, err=True)
        return
    from rich.text import Text

    with err_console.status(Text(first)) as status:
        yield lambda text: status.update(Text(text))


def _read_spec(spec_file: str) -> JobSpec:
    """The one job spec in ``spec_file``, read and checked as ``slotrunner submit`` does."""
    from runner.jobs.submit import SpecError, parse_spec

    data = read_json_file(spec_file)
    if isinstance(data, list):
        if len(data) != 1:
            raise CliError(f"{spec_file} holds {len(data)} job specs; envs build takes one")
        data = data[0]
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise CliError(str(exc)) from None


# -- rm ---------------------------------------------------------------------------


@envs.command("rm")
@click.argument("keys", nargs=-1, metavar="[KEY]...")
@click.option("--all", "remove_all", is_flag=True, help="Remove every environment of this host.")
@click.option("--json", "as_json", is_flag=True, help='Print {"removed": [...], "refused": [...]}.')
def remove(keys: tuple[str, ...], remove_all: bool, as_json: bool) -> None:
    """Remove the environments KEY... (see `envs list`), or with --all every one.

    One in use by a running job, or being built, is refused and kept; the others are
    removed all the same. A job that needs a removed environment builds it again.
    Exit 0 all removed, 2 a key that is not one, or one refused or not found.
    """
    from runner.envs.store import EnvBusy, EnvError

    if bool(keys) == remove_all:
        raise click.UsageError("name the environments to remove (KEY...) or give --all, not both")
    store = _store(Settings.from_env())
    for key in keys:
        store.root(key)  # every key checked before anything is removed
    targets = list(keys) if keys else store.keys()
    removed: list[str] = []
    refused: list[dict[str, str]] = []
    for key in targets:
        try:
            store.remove(key)
        except EnvBusy as exc:
            refused.append({"key": key, "error": f"{exc}; not removed"})
            continue
        except EnvError as exc:
            if remove_all:  # gone since it was listed: what was asked for
                continue
            refused.append({"key": key, "error": str(exc)})
            continue
        removed.append(key)
        if not as_json:
            click.echo(f"removed {key}")
    if as_json:
        emit_json({"removed": removed, "refused": refused})
    elif not targets:
        click.echo(f"no environments on this host ({store.dir})")
    if refused:
        raise CliError("; ".join(item["error"] for item in refused))
