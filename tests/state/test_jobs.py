"""Pending compactions: the job hash's priorities, due jobs, exclusive leases, expiry hand-over, finishing."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from compaction_worker.contracts.events import Trigger
from compaction_worker.state.jobs import JobQueue, JobRequest
from compaction_worker.state.store import NewMessage, Store

pytestmark = pytest.mark.integration


@pytest.fixture
def queue(redis_client: redis.asyncio.Redis) -> JobQueue:
    return JobQueue(redis_client, "t", lease_seconds=1)


async def test_schedule_claim_finish(queue: JobQueue) -> None:
    """A scheduled job is due, claimable once, and gone after finishing."""
    await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.due(10) == ["c"]
    claim = await queue.claim("c")
    assert claim is not None
    assert await queue.claim("c") is None  # leased
    assert await queue.due(10) == []
    job = await queue.load(claim)
    assert job is not None
    assert job.trigger is Trigger.THRESHOLD
    await queue.finish(claim, job)
    assert await queue.pending_count() == 0
    assert await queue.job("c") is None


async def test_lease_expiry_lets_another_worker_claim(queue: JobQueue) -> None:
    """A worker that dies leaves a lease that runs out; then the job is due again."""
    await queue.schedule("c", Trigger.MANUAL)
    assert await queue.claim("c") is not None
    await asyncio.sleep(1.1)
    assert await queue.due(10) == ["c"]
    assert await queue.claim("c") is not None


async def test_newer_request_survives_finish(queue: JobQueue) -> None:
    """A request that arrives while a compaction runs is not dropped when it finishes."""
    await queue.schedule("c", Trigger.THRESHOLD)
    claim = await queue.claim("c")
    assert claim is not None
    job = await queue.load(claim)
    await queue.schedule("c", Trigger.MANUAL)  # arrives mid-run
    await queue.finish(claim, job)
    pending = await queue.job("c")
    assert pending is not None
    assert pending.trigger is Trigger.MANUAL
    assert await queue.due(10) == ["c"]


async def test_index_entry_without_job_is_cleaned(queue: JobQueue) -> None:
    """An index entry whose job vanished (crash between writes) is removed on finish."""
    await queue.mark_due("ghost")
    claim = await queue.claim("ghost")
    assert claim is not None
    assert await queue.load(claim) is None
    await queue.finish(claim, None)
    assert await queue.pending_count() == 0


async def test_weaker_request_does_not_replace_stronger(queue: JobQueue) -> None:
    """A threshold request leaves a pending manual request in place; a reactive one replaces it."""
    assert await queue.schedule("c", Trigger.MANUAL)
    assert not await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.schedule("c", Trigger.REACTIVE, "x")
    job = await queue.job("c")
    assert job is not None
    assert (job.trigger, job.error) == (Trigger.REACTIVE, "x")


async def test_request_is_recorded_with_the_turn(queue: JobQueue) -> None:
    """A compaction request rides in the append script, so it cannot be lost alone; the caller indexes it."""
    store = Store(queue.redis, "t", None)
    request = JobRequest(Trigger.REACTIVE, "too long", estimate=1234)
    await store.append_turn(
        "c", 1, [NewMessage({"role": "user", "content": "a"}, 1)], {}, expected_count=0, request=request
    )
    job = await queue.job("c")
    assert job is not None
    assert (job.trigger, job.error, job.estimate) == (Trigger.REACTIVE, "too long", 1234)
    assert await queue.due(10) == []
    assert await queue.ensure_due("c")
    assert await queue.due(10) == ["c"]


async def test_ensure_due_without_a_job_indexes_nothing(queue: JobQueue) -> None:
    """Only a conversation with a pending job is made due."""
    assert not await queue.ensure_due("c")
    assert await queue.pending_count() == 0
