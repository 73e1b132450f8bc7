"""The compaction pool against real Redis: announced jobs wake an idle pool, no sweep needed.

Each test's pool sweeps once, at start, and then not for an hour: whatever it runs after
that, it found through a wake-up (state/wake.py) or a timer of its own. A counter on the
pool's sweep proves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.runtime.pool import CompactionPool, run_job
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import Sweep, now_ms
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.wake import Wake
from compaction_worker.summaries.contract import CountTokens, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from tests.orchestration import Parts, Published, compactor_with, conversation, extractive, make_parts

pytestmark = pytest.mark.integration

COUNT = counter_for("gpt-4o-mini", Settings().budget).text  # the model of orchestration's turns
HOUR = 3600.0
WITHIN = 30.0
"""Only a bound against hanging: every wait below ends on an event of the test's own."""


class Done(Published):
    """A publisher that also counts completion events, and says when there are ``expected`` of them."""

    def __init__(self, expected: int = 1) -> None:
        super().__init__()
        self.expected = expected
        self.all_done = asyncio.Event()

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        await super().__call__(topic, payload, key)
        if len(self.on("compaction.completed")) >= self.expected:
            self.all_done.set()


@dataclass(eq=False)
class Counted(CompactionPool):
    """The pool, with its sweeps counted; ``swept`` is set once it swept at all."""

    sweeps: int = 0
    swept: asyncio.Event = field(default_factory=asyncio.Event)

    async def sweep(self) -> Sweep:
        result = await super().sweep()
        self.sweeps += 1
        self.swept.set()
        return result


@pytest.fixture
async def pool(parts: Parts) -> AsyncIterator[tuple[Counted, Done]]:
    """A started pool that sweeps at start only, over ``parts``' Redis, waiting on its wake-ups."""
    done = Done()
    pool = Counted(
        compactor_with(parts, done, extractive),
        parts.jobs,
        size=2,
        sweep_interval=HOUR,
        idle_sweep_max=HOUR,
        wakes=parts.jobs.index.wakes,
    )
    pool.start()
    await asyncio.wait_for(pool.swept.wait(), WITHIN)
    try:
        yield pool, done
    finally:
        await pool.stop(grace=5)


async def _until_scheduled(parts: Parts) -> None:
    """Handle the conversation's turns up to the one that schedules its compaction."""
    for event in conversation(40):
        if (await parts.turns.handle(event, b"c")).scheduled is not None:
            return
    raise AssertionError("the conversation never crossed its threshold")


async def _under_threshold(parts: Parts) -> None:
    for event in conversation(10):
        await parts.turns.handle(event, b"c")
    assert await parts.jobs.job("c") is None


async def test_an_idle_pool_runs_a_job_announced_by_another_worker(
    pool: tuple[Counted, Done], parts: Parts
) -> None:
    """A turn handled elsewhere schedules a job: the idle pool is woken and runs it, without a sweep."""
    counted, done = pool
    await _until_scheduled(parts)  # ``parts``' own pool is not running: it cannot take the job
    await asyncio.wait_for(done.all_done.wait(), WITHIN)
    await asyncio.wait_for(asyncio.gather(*counted.tasks.values()), WITHIN)  # its finish, after the event
    assert (await parts.store.meta("c")).version == 1
    assert counted.sweeps == 1, "the job was found by a sweep, not announced"
    assert await parts.jobs.job("c") is None
    assert await parts.jobs.pending_count() == 0


async def test_a_delayed_job_runs_when_due_not_before(pool: tuple[Counted, Done], parts: Parts) -> None:
    """A job scheduled with a delay is announced for its time: the pool keeps a timer and runs it then."""
    counted, done = pool
    await _under_threshold(parts)
    await parts.jobs.schedule("c", Trigger.MANUAL, delay_seconds=0.5)
    due = await parts.jobs.index.score("c")
    assert due is not None
    await asyncio.wait_for(done.all_done.wait(), WITHIN)
    await asyncio.wait_for(asyncio.gather(*counted.tasks.values()), WITHIN)  # its finish, after the event
    ran_at = now_ms()
    assert ran_at >= due
    (event,) = done.on("compaction.completed")
    assert event["outcome"] == Outcome.COMPACTED.value
    assert counted.sweeps == 1


async def test_a_busy_conversation_is_tried_again_when_its_lock_would_expire(
    pool: tuple[Counted, Done], parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead worker's lock (never renewed) makes the job busy: tried once, then again when the lock
    has expired, and run; not retried in between."""
    counted, done = pool
    dead = await Locks(parts.store.redis, 0.5).acquire("c", parts.store.keys("c"))
    assert isinstance(dead, Lease)
    attempts: list[bool] = []
    acquire = parts.jobs.locks.acquire

    async def counting(cid: str, keys: object) -> object:
        got = await acquire(cid, keys)  # type: ignore[arg-type]  # the keys pass through untouched
        attempts.append(isinstance(got, Lease))
        return got

    monkeypatch.setattr(parts.jobs.locks, "acquire", counting)
    await _under_threshold(parts)
    await parts.jobs.schedule("c", Trigger.MANUAL)
    await asyncio.wait_for(done.all_done.wait(), WITHIN)
    await asyncio.wait_for(asyncio.gather(*counted.tasks.values()), WITHIN)  # its finish, after the event
    assert attempts == [False, True]
    assert counted.sweeps == 1


class Held(ExtractiveSummarizer):
    """The extractive summary, once ``release`` is set; ``asked`` is set when a run asks for one."""

    def __init__(self, count_tokens: CountTokens) -> None:
        super().__init__(count_tokens)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.asked.set()
        await self.release.wait()
        return await super().summarize(request)


async def test_a_request_made_during_its_own_run_runs_next(parts: Parts) -> None:
    """A stronger request arrives while the pool runs the conversation's job: its announcement
    finds the job running here, and the pool looks at it again when the run ends."""
    done = Done(expected=2)
    summarizer = Held(COUNT)
    pool = Counted(
        compactor_with(parts, done, lambda _m, _c: [summarizer]),
        parts.jobs,
        size=2,
        sweep_interval=HOUR,
        idle_sweep_max=HOUR,
        wakes=parts.jobs.index.wakes,
    )
    pool.start()
    try:
        await asyncio.wait_for(pool.swept.wait(), WITHIN)
        await _until_scheduled(parts)
        await asyncio.wait_for(summarizer.asked.wait(), WITHIN)
        await parts.jobs.schedule("c", Trigger.MANUAL)  # announced while the first run holds the lock
        summarizer.release.set()
        await asyncio.wait_for(done.all_done.wait(), WITHIN)
        await asyncio.wait_for(asyncio.gather(*pool.tasks.values()), WITHIN)
    finally:
        await pool.stop(grace=5)
    assert [e["trigger"] for e in done.on("compaction.completed")] == ["threshold", "manual"]
    assert pool.sweeps == 1
    assert await parts.jobs.job("c") is None


async def test_stop_hands_back_the_wake_ups_it_held(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that stops announces again what it had popped and not acted on yet, for the others."""
    wakes = parts.jobs.index.wakes
    assert wakes is not None
    pool = CompactionPool(
        compactor_with(parts, Published(), extractive),
        parts.jobs,
        size=1,
        sweep_interval=HOUR,
        idle_sweep_max=HOUR,
        wakes=wakes,
    )
    later = now_ms() + 3_600_000
    popped = asyncio.Event()
    take = wakes.next

    async def taking(wait_seconds: float) -> Wake | None:
        wake = await take(wait_seconds)
        if wake is not None:
            popped.set()
        return wake

    monkeypatch.setattr(wakes, "next", taking)
    pool.start()
    await wakes.announce(Wake("jobs", "c", later))

    await asyncio.wait_for(popped.wait(), WITHIN)
    await pool.stop(grace=1)
    assert await take(0.01) == Wake("jobs", "c", later)


async def test_a_stuck_run_is_cut_off_at_its_deadline_and_backs_off(
    redis_client: RedisClient, settings: Settings
) -> None:
    """A run that never ends (its LLM call hangs) cannot keep its renewed lock forever: past the
    deadline it is cancelled, counted as a failure, its lock freed, and its conversation scheduled
    again after the backoff."""
    settings.retry.compaction_deadline_seconds = 0.5
    summarizer = Held(COUNT)  # never released
    parts = make_parts(redis_client, settings, Published(), lambda _m, _c: [summarizer])
    await _until_scheduled(parts)
    assert await run_job(parts.jobs, parts.compactor, "c") is None
    assert summarizer.asked.is_set()
    meta = await parts.store.meta("c")
    assert meta.failures == 1
    assert meta.retry_after > 0
    assert await redis_client.get(parts.store.keys("c").lock) is None
    job = await parts.jobs.job("c")
    assert job is not None  # the next run's
    score = await parts.jobs.index.score("c")
    assert score is not None
    assert score >= int(meta.retry_after * 1000) - 1  # after the backoff, not at once
