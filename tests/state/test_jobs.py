"""Pending compactions: the job's priorities, due jobs, the lock as the claim, take-over, finishing."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from compaction_worker.contracts.events import Trigger
from compaction_worker.conversation.apply import NewMessage
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.conversation.meta import JobRequest
from compaction_worker.settings import DEFAULT_INDEX_SHARDS
from compaction_worker.state.index import now_ms
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.store import Store
from compaction_worker.state.wake import Wakes
from tests.state.helpers import append_turn

pytestmark = pytest.mark.integration

TTL = 1.0
"""The lock's TTL, in seconds: a dead claimer's job is taken over this long after its last renewal."""


@pytest.fixture
def queue(redis_client: redis.asyncio.Redis) -> JobQueue:
    return JobQueue(
        redis_client,
        "t",
        Locks(redis_client, TTL),
        shards=DEFAULT_INDEX_SHARDS,
        wakes=Wakes(redis_client, "t"),
    )


async def test_schedule_claim_finish(queue: JobQueue, redis_client: redis.asyncio.Redis) -> None:
    """A scheduled job is due and claimed by taking its lock; a second claimer skips it; finished, it is gone."""
    await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.due(10) == ["c"]
    async with queue.claim("c") as claim:
        assert claim is not None
        assert claim.job.trigger is Trigger.THRESHOLD
        assert await redis_client.get(conversation_keys("c", "t").lock) == claim.lease.token.encode()
        async with queue.claim("c") as second:
            assert second is None  # the lock is the claim: one at a time
        # The entry says when to look if this worker dies: when its lock would expire.
        assert await queue.due(10) == []
        score = await queue.index.score("c")
        assert score is not None
        assert now_ms() < score <= now_ms() + TTL * 1000
        await queue.finish(claim)
    assert await queue.pending_count() == 0
    assert await queue.job("c") is None
    assert await redis_client.get(conversation_keys("c", "t").lock) is None
    assert not await redis_client.exists(conversation_keys("c", "t").meta)  # it held the job alone


async def test_a_dead_claimers_job_is_taken_over_when_its_lock_expires(queue: JobQueue) -> None:
    """A worker that dies holding the lock leaves the job to whoever looks after the lock ran out, not before."""
    await queue.schedule("c", Trigger.MANUAL)
    dead = await queue.locks.acquire("c", conversation_keys("c", "t"))  # never renewed, never released
    assert isinstance(dead, Lease)
    async with queue.claim("c") as claim:
        assert claim is None
    score = await queue.index.score("c")
    assert score is not None
    assert score > now_ms(), "a busy lock must not be retried hot"
    assert await queue.due(10) == []
    await asyncio.sleep(max(0.0, score / 1000 - time.time()) + 0.05)
    assert await queue.due(10) == ["c"]
    async with queue.claim("c") as claim:
        assert claim is not None
        assert claim.lease.fence == dead.fence + 1
        assert claim.job.trigger is Trigger.MANUAL
        await queue.finish(claim)
    assert await queue.pending_count() == 0


async def test_newer_request_survives_finish(queue: JobQueue) -> None:
    """A request that arrives while a compaction runs is not dropped when it finishes: due at once."""
    await queue.schedule("c", Trigger.THRESHOLD)
    async with queue.claim("c") as claim:
        assert claim is not None
        await queue.schedule("c", Trigger.MANUAL)  # arrives mid-run
        await queue.finish(claim)
    pending = await queue.job("c")
    assert pending is not None
    assert pending.trigger is Trigger.MANUAL
    assert await queue.due(10) == ["c"]


async def test_a_request_recorded_while_the_entry_goes_is_indexed_again(
    queue: JobQueue, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finish removes the entry, then reads the job again: a job written in between (its writer
    indexes it only after writing it, and may die first) keeps an entry."""
    await queue.schedule("c", Trigger.THRESHOLD)
    remove = queue.index.remove

    async def remove_then_record(cid: str) -> None:
        await remove(cid)
        fields = JobRequest(Trigger.MANUAL).fields()
        await redis_client.hset(conversation_keys(cid, "t").meta, mapping=fields)  # type: ignore[arg-type]  # redis-py's mapping type is invariant

    async with queue.claim("c") as claim:
        assert claim is not None
        monkeypatch.setattr(queue.index, "remove", remove_then_record)
        await queue.finish(claim)  # the job that ran goes, then its entry; then the new job is written
    job = await queue.job("c")
    assert job is not None
    assert job.trigger is Trigger.MANUAL
    assert await queue.due(10) == ["c"]


async def test_a_job_is_recorded_before_it_is_indexed(
    queue: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that dies between its two writes leaves a job without an entry, never the reverse;
    the redelivered turn (its duplicate reply says a job is pending) or the next threshold check indexes it."""

    async def dies(_cid: str, _delay: float = 0.0) -> None:
        raise ConnectionError("the worker died here")

    with monkeypatch.context() as patch:
        patch.setattr(queue, "mark_due", dies)
        with pytest.raises(ConnectionError):
            await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.job("c") is not None
    assert await queue.pending_count() == 0
    assert not await queue.schedule("c", Trigger.THRESHOLD)  # the same request: nothing new...
    assert await queue.due(10) == ["c"]  # ...but the pending job is indexed again
    # A delayed entry keeps its delay when nothing new is requested.
    await queue.mark_due("c", delay_seconds=60)
    assert not await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.due(10) == []


async def test_an_unfinished_claim_is_handed_back(queue: JobQueue, redis_client: redis.asyncio.Redis) -> None:
    """A block that does not finish its job releases the lock, then makes the job due again: at once
    when it stopped (a shutdown), after the lock's TTL when it raised (no hot loop over a failing run)."""
    lock = conversation_keys("c", "t").lock
    await queue.schedule("c", Trigger.THRESHOLD)
    async with queue.claim("c") as claim:
        assert claim is not None
    assert await redis_client.get(lock) is None
    assert await queue.due(10) == ["c"]

    async def failing_run() -> None:
        async with queue.claim("c") as claim:
            assert claim is not None
            raise RuntimeError("a bug in the run")

    with pytest.raises(RuntimeError):
        await failing_run()
    assert await redis_client.get(lock) is None
    assert await queue.due(10) == []
    score = await queue.index.score("c")
    assert score is not None
    assert score > now_ms()
    assert await queue.job("c") is not None


async def test_index_entry_without_job_is_cleaned(queue: JobQueue) -> None:
    """An index entry whose job vanished is removed by whoever claims it."""
    await queue.mark_due("ghost")
    async with queue.claim("ghost") as claim:
        assert claim is None
    assert await queue.pending_count() == 0


async def test_arming_an_entry_announces_it(queue: JobQueue, redis_client: redis.asyncio.Redis) -> None:
    """Every write that arms an entry announces when to look at it; a waiting worker takes it (once)."""
    assert queue.index.wakes is not None
    await queue.schedule("c", Trigger.THRESHOLD, delay_seconds=5)
    wake = await queue.index.wakes.next(1)
    assert wake is not None
    assert (wake.kind, wake.conversation_id) == ("jobs", "c")
    assert now_ms() + 4000 < wake.at_ms <= now_ms() + 5000
    assert await queue.index.wakes.next(0.01) is None


async def test_weaker_request_does_not_replace_stronger(queue: JobQueue) -> None:
    """A threshold request leaves a pending manual request in place; a reactive one replaces it."""
    assert await queue.schedule("c", Trigger.MANUAL)
    assert not await queue.schedule("c", Trigger.THRESHOLD)
    assert await queue.schedule("c", Trigger.REACTIVE, "x")
    job = await queue.job("c")
    assert job is not None
    assert (job.trigger, job.error) == (Trigger.REACTIVE, "x")


async def test_a_pending_job_keeps_every_requests_instructions(queue: JobQueue) -> None:
    """Whichever request's job stays pending, it carries the other requests' instructions after its own."""
    store = Store(queue.redis, "t", None)

    async def request(seq: int, trigger: Trigger, instructions: str | None) -> None:
        turn = [NewMessage({"role": "user", "content": f"turn {seq}"}, 1)]
        asked = JobRequest(
            trigger, "too long" if trigger is Trigger.REACTIVE else None, instructions=instructions
        )
        await append_turn(store, "c", seq, turn, {}, request=asked)

    async def pending() -> str | None:
        job = await queue.job("c")
        assert job is not None
        return job.instructions

    await request(1, Trigger.MANUAL, "keep the migration plan")
    await request(2, Trigger.MANUAL, "keep every failing test name")  # equal priority: the first stays
    assert await pending() == "keep the migration plan\n\nkeep every failing test name"
    await request(3, Trigger.MANUAL, "keep every failing test name")  # already there: not repeated
    await request(4, Trigger.THRESHOLD, None)  # weaker, none of its own: nothing changes
    assert await pending() == "keep the migration plan\n\nkeep every failing test name"
    await request(5, Trigger.REACTIVE, "keep the stack trace")  # stronger: its own first
    job = await queue.job("c")
    assert job is not None
    assert (job.trigger, job.instructions) == (
        Trigger.REACTIVE,
        "keep the stack trace\n\nkeep the migration plan\n\nkeep every failing test name",
    )
    await request(6, Trigger.MANUAL, "x" * 4000)  # past 8,000 characters together: the newest alone
    await request(7, Trigger.MANUAL, "y" * 4000)
    assert await pending() == "y" * 4000


async def test_request_is_recorded_with_the_turn(queue: JobQueue) -> None:
    """A compaction request is written with the append, so it cannot be lost alone; the caller indexes it."""
    store = Store(queue.redis, "t", None)
    request = JobRequest(Trigger.REACTIVE, "too long", estimate=1234)
    turn = [NewMessage({"role": "user", "content": "a"}, 1)]
    await append_turn(store, "c", 1, turn, {}, request=request)
    job = await queue.job("c")
    assert job is not None
    assert (job.trigger, job.error, job.estimate) == (Trigger.REACTIVE, "too long", 1234)
    assert await queue.due(10) == []  # the worker died before indexing it
    # Its redelivery is a duplicate whose reply says a job is pending: the handler indexes it.
    assert (await append_turn(store, "c", 1, turn, {}, request=request)).job
    await queue.mark_due("c")
    assert await queue.due(10) == ["c"]
