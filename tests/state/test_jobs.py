"""The job index: due jobs, exclusive leases, expiry hand-over, and finishing."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from compaction_worker.contracts.events import Trigger
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.store import Store

pytestmark = pytest.mark.integration


@pytest.fixture
def queue(redis_client: redis.asyncio.Redis) -> JobQueue:
    return JobQueue(Store(redis_client, "t", None), lease_seconds=1)


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
    assert await queue.store.job("c") is None


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
    pending = await queue.store.job("c")
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
