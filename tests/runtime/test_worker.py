"""The compaction pool's graceful stop: finish within the grace period, or hand the job back.

Issue 4 (failure policy): graceful shutdown finishes or hands back in-flight compactions
within a configured grace period. Against the real Redis; the summarizer is a stand-in
that waits, so the test decides when the "LLM call" ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import Outcome
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.worker import CompactionPool
from compaction_worker.settings import Settings
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.llm import CountTokens, SummaryRequest, SummaryResult
from tests.orchestration import Published, conversation

COUNT = counter_for("gpt-4o-mini", Settings().budget).text  # the model of orchestration's turns


class Slow(ExtractiveSummarizer):
    """The extractive summary, given only once ``release`` is set; ``asked`` is set on entry."""

    def __init__(self, count_tokens: CountTokens = COUNT) -> None:
        super().__init__(count_tokens)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.asked.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await super().summarize(request)


async def _over_threshold(parts: Any) -> None:
    turns, _, _, jobs = parts
    for event in conversation(24):
        await turns.handle(event, b"c")
    assert await jobs.pending_count() == 1


def _pool(
    parts: Any, settings: Settings, published: Published, summarizer: ExtractiveSummarizer
) -> CompactionPool:
    _, base, store, jobs = parts
    compactor = Compactor(
        settings, store, base.locks, jobs, published, summarizers=lambda _m, _c: [summarizer]
    )
    return CompactionPool(compactor, jobs, size=2, sweep_interval=0.05)


async def test_stop_lets_a_compaction_finish_within_the_grace(
    parts: Any, settings: Settings, published: Published
) -> None:
    """A compaction that ends inside the grace period commits; nothing is handed back."""
    await _over_threshold(parts)
    _, _, store, jobs = parts
    summarizer = Slow()
    pool = _pool(parts, settings, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)

    stopping = asyncio.create_task(pool.stop(grace=10))
    await asyncio.sleep(0.2)
    assert not stopping.done(), "stop() did not wait for the running compaction"
    summarizer.release.set()
    await asyncio.wait_for(stopping, 10)

    assert (pool.completed, pool.failed, summarizer.cancelled) == (1, 0, False)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await store.meta("c")).version == 1
    assert await jobs.pending_count() == 0


async def test_stop_hands_back_a_compaction_that_outlasts_the_grace(
    parts: Any, settings: Settings, published: Published
) -> None:
    """Past the grace period the compaction is cancelled, its lock released and its job due
    now, so another worker takes it over at once instead of after the lease or the lock TTL."""
    await _over_threshold(parts)
    _, _, store, jobs = parts
    keys = store.keys("c")
    summarizer = Slow()
    pool = _pool(parts, settings, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)
    assert await store.redis.exists(keys.lock)

    began = time.monotonic()
    await pool.stop(grace=0.3)
    took = time.monotonic() - began
    assert summarizer.cancelled
    assert 0.3 <= took < 5, took
    assert not pool.tasks
    assert not await store.redis.exists(keys.lock), "the lock outlived the handed-back compaction"
    assert published.on("compaction.completed") == []
    assert (await store.meta("c")).version == 0
    assert await jobs.due(10) == ["c"], "the job is not due again"

    # Another worker's pool finishes it right away.
    other = _pool(parts, settings, published, ExtractiveSummarizer(COUNT))
    assert await other.sweep() == 1
    await asyncio.wait_for(asyncio.gather(*other.tasks.values()), 10)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await store.meta("c")).version == 1
    assert await jobs.pending_count() == 0
    await other.stop(grace=1)
