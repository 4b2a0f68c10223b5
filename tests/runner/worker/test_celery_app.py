"""The app factory: the worker's modules by Celery's include, test options only as arguments."""

from __future__ import annotations

import redis

from ops.testing.worker import broker_options
from runner.core.settings import Settings
from runner.jobs.config import JobConfig
from runner.worker.celery_app import create_app, worker_argv
from runner.worker.context import WorkerContext
from runner.worker.liveness import Claimed, Liveness

# What a test could once set to change a normally started worker; now ignored.
OLD_SWITCHES = {
    "SLOTRUNNER_TEST_UNACKED_RESTORE_S": "0.5",
    "SLOTRUNNER_TEST_DISABLE_ATTEMPT_FLOOR": "1",
}


def test_a_normal_app_names_its_worker_modules_and_ignores_test_switches(
    settings: Settings,
) -> None:
    """The task and the janitor hooks are imported by the worker; old switches change nothing."""
    app = create_app(settings, redis_url=settings.redis_url, env=OLD_SWITCHES)
    assert {"runner.worker.tasks", "hooks.celery_hooks"} <= set(app.conf.include)
    assert app.conf.broker_transport_options == {"visibility_timeout": 300.0}
    assert app.slotrunner_attempt_floor is True


def test_test_options_are_arguments_of_the_factory(settings: Settings) -> None:
    """A quick unacked restore and a worker without the floor exist only as create_app args."""
    app = create_app(
        settings, redis_url=settings.redis_url, broker_options=broker_options(1.0), env={}
    )
    assert app.conf.broker_transport_options == {
        "visibility_timeout": 300.0,
        "unacked_restore_interval": 1.0,
        "unacked_restore_throttle": 1,
    }
    assert broker_options(None) == {}
    off = create_app(settings, redis_url=settings.redis_url, env={}, attempt_floor=False)
    assert off.slotrunner_attempt_floor is False


def test_worker_argv_consumes_the_job_queue(settings: Settings) -> None:
    """Both worker entry points consume the job queue, without mingle or gossip."""
    argv = worker_argv(settings, concurrency=3, pool="solo", loglevel="INFO", hostname=None)
    assert argv[:3] == ["worker", "-Q", "slotrunner"]
    assert "--without-mingle" in argv and argv[-1] == f"slotrunner-{settings.host}@%h"


def test_a_context_without_the_floor_claims_on_redis_alone(
    settings: Settings, redis_client: redis.Redis
) -> None:
    """attempt_floor=False: the claim writes no floor file; the default writes one."""
    for floor, job in ((False, "no-floor-1"), (True, "floor-1")):
        ctx = WorkerContext.build(settings, JobConfig(), attempt_floor=floor)
        assert ctx.floor_home == (settings.home if floor else None)
        claimed = Liveness(redis_client, job, ctx.config, home=ctx.floor_home).claim()
        assert isinstance(claimed, Claimed) and claimed.attempt == 1
        assert (settings.home / "attempts" / job).exists() is floor
