"""A job's environment, from the worker's side: planned, built or found, held, reported.

Called by ``runner.worker.attempt`` once the slot's tree is prepared (the base commit
is known): the environment is built from that commit's files in the source's mirror,
never from the slot (docs/architecture.md §Environments). While it is built or
waited for, the job's phase in Redis says so (``slotrunner result``); the hold is
kept until the attempt's slot is released, so no eviction takes it from a running job.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.core import keys
from runner.envs.build import Ready, ensure, plan
from runner.envs.store import GB, EnvError, EnvStore
from runner.jobs import events as job_events
from runner.jobs.models import JobSpec
from runner.worker.context import WorkerContext
from runner.workspace.cache import mirror_of
from runner.workspace.source import parse_source
from runner.workspace.workspaces import Prepared

# The phase key outlives a worker that died mid-build only this long.
_PHASE_TTL_S = 24 * 3600


def store_of(ctx: WorkerContext) -> EnvStore:
    return EnvStore(ctx.settings.home, max_bytes=int(ctx.settings.envs_max_gb * GB))


def take(
    ctx: WorkerContext,
    spec: JobSpec,
    prepared: Prepared,
    *,
    attempt: int,
    should_stop: Callable[[], str | None],
) -> Ready:
    """The job's environment, held; raises :class:`EnvError` (the job's failure)."""
    assert spec.environment is not None and spec.job_id is not None
    job_id = spec.job_id
    where = {"job_id": job_id, "attempt": attempt}
    key = None
    try:
        cache = ctx.workspaces.caches.cache_path(parse_source(spec.repo))
        planned = plan(
            ctx.settings,
            spec.environment,
            repo=spec.repo,
            source_key=prepared.repo_key,
            mirror=mirror_of(cache),
            base_commit=prepared.base_commit,
        )
        key = planned.id

        def phase(text: str) -> None:
            ctx.redis.set(keys.job_phase(job_id), text, ex=_PHASE_TTL_S)

        ready = ensure(store_of(ctx), planned, job_id=job_id, phase=phase, should_stop=should_stop)
    except EnvError as exc:
        ctx.log.emit(job_events.ENVIRONMENT_FAILED, key=key, error=str(exc)[:4000], **where)
        raise
    finally:
        ctx.redis.delete(keys.job_phase(job_id))
    if ready.built:
        ctx.log.emit(
            job_events.ENVIRONMENT_BUILT,
            key=ready.key,
            build_s=ready.build_s,
            log=str(ready.log),
            **where,
        )
    else:
        ctx.log.emit(job_events.ENVIRONMENT_REUSED, key=ready.key, wait_s=ready.wait_s, **where)
    return ready
