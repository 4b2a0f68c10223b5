"""The gateway's cheaper desk and credential calls keep the semantics of the calls they
replace (docs/architecture.md §Gateway, §Admission): the credential check's kept grant
never outlives a revoke or an attempt bump, and apply-and-release in one script call
commits once, gives the capacity back once, and refuses a stale lease; the acquire on
the loop grants, refuses, queues and gives up as the threaded one."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio

from runner.admission.desk import AdmissionDesk
from runner.admission.lease import (
    AdmissionRefused,
    DeskMismatch,
    Lease,
    RefusalReason,
    StaleCompletion,
)
from runner.core import keys
from runner.gateway import mint_credential, revoke_credential
from runner.gateway.app import async_twin
from runner.gateway.credentials import Authenticator, digest


def _mint(client: redis.Redis, job_id: str) -> str:
    return mint_credential(
        client,
        gateway_url="http://127.0.0.1:1/v1",
        ttl_s=60,
        eval_run=f"rt-{uuid.uuid4().hex[:8]}",
        job_id=job_id,
        attempt=1,
        upstream="http://127.0.0.1:2/v1",
        bound=2,
    ).secret


def test_a_kept_grant_is_refused_at_once_after_a_revoke_or_a_newer_attempt(
    redis_client: redis.Redis,
) -> None:
    async def go() -> None:
        async with async_twin(redis_client) as aio:
            check = Authenticator(aio)
            job = f"job-{uuid.uuid4().hex[:8]}"
            secret = _mint(redis_client, job)
            first = await check(secret)
            assert first is not None and first.superseded_by is None
            second = await check(secret)  # from the kept grant
            assert second is not None and second.grant == first.grant
            redis_client.set(keys.job_attempt(job), 2)
            bumped = await check(secret)
            assert bumped is not None and bumped.superseded_by == 2
            assert revoke_credential(redis_client, secret)
            assert await check(secret) is None
            assert await check("srgw-" + "x" * 43) is None
            assert await check("not-a-credential") is None

    asyncio.run(go())


def test_a_grant_rewritten_under_its_digest_is_read_again_not_taken_from_memory(
    redis_client: redis.Redis,
) -> None:
    async def go() -> None:
        async with async_twin(redis_client) as aio:
            check = Authenticator(aio)
            secret = _mint(redis_client, "job-a")
            before = await check(secret)
            assert before is not None and before.grant.job_id == "job-a"
            key = keys.gateway_credential(digest(secret))
            rewritten = before.grant.model_copy(update={"job_id": "job-b"})
            redis_client.set(key, rewritten.model_dump_json(), px=60_000)
            after = await check(secret)
            assert after is not None and after.grant.job_id == "job-b"
            redis_client.set(key, "{not json", px=60_000)
            assert await check(secret) is None

    asyncio.run(go())


@pytest.mark.parametrize("on_loop", [False, True])
def test_apply_and_release_commits_once_frees_the_capacity_and_refuses_stale(
    redis_client: redis.Redis, on_loop: bool
) -> None:
    async def go() -> None:
        async with async_twin(redis_client) as aio:
            desk = AdmissionDesk(redis_client, f"rt-{uuid.uuid4().hex[:8]}", 1, aio_client=aio)

            async def both(lease: Lease) -> bool:
                if on_loop:
                    return await desk.apply_and_release_async(lease)
                return desk.apply_and_release(lease)

            lease = desk.acquire(7, 0)
            assert await both(lease) is True
            stats = desk.stats()
            assert stats["in_flight"] == 0 and stats["released"] == 1
            assert desk.committed_lease(7) == lease.lease_id
            again = desk.acquire(7, 0)  # the capacity is back: the bound of 1 admits it
            assert await both(again) is False  # the step was committed: a duplicate
            assert desk.stats()["in_flight"] == 0
            with pytest.raises(StaleCompletion):
                await both(lease)  # released: stale, and not released twice
            stats = desk.stats()
            assert stats["in_flight"] == 0 and stats["released"] == 2
            assert stats["double_release"] == 1
            expired = desk.acquire(8, 0)
            assert desk.expire(expired)
            with pytest.raises(StaleCompletion):
                await both(expired)  # its late body: stale, but the capacity comes back
            assert desk.stats()["in_flight"] == 0

    asyncio.run(go())


def test_a_desk_without_an_aio_client_says_so(redis_client: redis.Redis) -> None:
    desk = AdmissionDesk(redis_client, f"rt-{uuid.uuid4().hex[:8]}", 1)
    lease = desk.acquire(1, 0)
    with pytest.raises(RuntimeError, match="aio_client"):
        asyncio.run(desk.apply_and_release_async(lease))
    assert desk.release(lease)


def test_acquire_on_the_loop_grants_refuses_queues_and_leaves_the_queue(
    redis_client: redis.Redis,
) -> None:
    """acquire_async keeps acquire's rules (§Admission): a grant up to the bound, a no-wait
    refusal at it, a queued caller served by a release, a deadline refusal, and a
    cancelled waiter's queue entry given up; the desk's counts say so after each."""
    eval_run = f"rt-{uuid.uuid4().hex[:8]}"

    async def waiting_is(desk: AdmissionDesk, count: int) -> None:
        for _ in range(500):
            if desk.stats()["waiting"] == count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the desk never had {count} waiting")

    async def go() -> None:
        async with async_twin(redis_client) as aio:
            desk = AdmissionDesk(redis_client, eval_run, 1, aio_client=aio, poll_s=0.01)
            held = await desk.acquire_async(1, 0)
            assert (held.step, held.generation, held.epoch) == (1, 1, desk.epoch())
            with pytest.raises(AdmissionRefused) as full:
                await desk.acquire_async(2, 0)
            assert full.value.reason is RefusalReason.BOUND
            queued = asyncio.ensure_future(desk.acquire_async(3, 30.0))
            await waiting_is(desk, 1)
            assert desk.release(held)
            served = await queued
            assert served.step == 3 and served.generation == 2
            with pytest.raises(AdmissionRefused) as late:
                await desk.acquire_async(4, 0.1)
            assert late.value.reason is RefusalReason.DEADLINE
            cancelled = asyncio.ensure_future(desk.acquire_async(5, 30.0))
            await waiting_is(desk, 1)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            stats = desk.stats()
            assert (stats["waiting"], stats["in_flight"]) == (0, 1)
            assert (stats["acquired"], stats["refused"]) == (2, 3)
            other = AdmissionDesk(redis_client, eval_run, 2, aio_client=aio)
            with pytest.raises(DeskMismatch, match="bound 1"):
                await other.acquire_async(6, 0)
            assert desk.release(served)

    asyncio.run(go())


def test_acquire_on_the_loop_needs_an_aio_client(redis_client: redis.Redis) -> None:
    desk = AdmissionDesk(redis_client, f"rt-{uuid.uuid4().hex[:8]}", 1)
    with pytest.raises(RuntimeError, match="aio_client"):
        asyncio.run(desk.acquire_async(1, 0))
    assert desk.stats()["in_flight"] == 0
