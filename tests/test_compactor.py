"""One compaction run against real Redis: commit, busy lock, no-op, stage savings, reactive mode."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from compaction_worker.compactor import Compactor
from compaction_worker.events import (
    CompactionCompleted,
    CompactionStarted,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.history import render
from compaction_worker.lock import Locks
from compaction_worker.settings import Settings
from compaction_worker.store import Store
from compaction_worker.strategies import provider_problems
from compaction_worker.summarizer import SummaryRequest, SummaryResult
from compaction_worker.tokens import budget_for, calibrate
from compaction_worker.turns import TurnHandler
from tests.orchestration import Published, assistant, compact_now, conversation, overhead, raw, user

pytestmark = pytest.mark.integration


class TestCompactor:
    async def test_compaction_commits_and_reports(self, parts: Any, published: Published) -> None:
        """A due job compacts under the target, commits, and publishes consistent events."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        claim = await jobs.claim("c")
        assert claim is not None
        completed = await compactor.run(claim)
        assert completed is not None
        assert completed.outcome is Outcome.COMPACTED
        (started,) = [CompactionStarted.model_validate(e) for e in published.on("compaction.started")]
        (done,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert started.compaction_id == done.compaction_id
        assert started.tokens_before == done.tokens_before > done.tokens_after
        assert done.tokens_after <= done.target
        snapshot = await store.snapshot("c")
        assert snapshot.meta.version == done.version == 1
        assert snapshot.meta.total_tokens <= done.target
        assert provider_problems(render(snapshot.history)) == []
        covered = {n for c in snapshot.history.chunks for n in range(c.first_n, c.last_n + 1) if c.covers(n)}
        assert covered | {e.n for e in snapshot.history.entries} == set(range(1, 25))
        assert await store.job("c") is None

    async def test_busy_lock_postpones(self, parts: Any, redis_client: redis.asyncio.Redis) -> None:
        """When another worker holds the lock, the job is postponed, not run twice."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        other = await Locks(redis_client, 30).acquire("c", store.keys("c"))
        assert other is not None
        claim = await jobs.claim("c")
        assert await compactor.run(claim) is None
        assert await store.job("c") is not None
        assert await jobs.due(5) == []

    async def test_noop_is_not_retried_in_a_loop(self, parts: Any, published: Published) -> None:
        """A compaction that cannot shrink commits nothing and blocks re-triggering (invariant 5)."""
        turns, compactor, store, jobs = parts
        # The system prompt alone is over the target: no stage can reach it.
        await turns.handle(raw("c", 1, user("hi"), system_prompt="rule " * 900, context_window=1024), b"c")
        claim = await jobs.claim("c")
        completed = await compactor.run(claim)
        assert completed is not None
        assert completed.outcome is Outcome.NOOP
        assert (await store.meta("c")).version == 0
        outcome = await turns.handle(raw("c", 2, assistant("ok"), context_window=1024), b"c")
        assert outcome.scheduled is None


class TestStageSavings:
    async def test_savings_account_for_the_tokens_saved(self, parts: Any) -> None:
        """Each reported stage has its saving; together they explain before minus after."""
        turns, compactor, _, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        done = await compact_now(jobs, compactor)
        assert done.outcome is Outcome.COMPACTED
        assert set(done.stage_savings) <= set(done.stages)
        assert done.stage_savings["summarize"] > 0
        # The first chunk brings the summary turn's own overhead with it.
        assert sum(done.stage_savings.values()) - overhead() == done.tokens_before - done.tokens_after

    async def test_noop_saves_nothing(self, parts: Any) -> None:
        """A compaction that commits nothing reports no savings."""
        turns, compactor, _, jobs = parts
        await turns.handle(raw("c", 1, user("hi"), system_prompt="rule " * 900, context_window=1024), b"c")
        done = await compact_now(jobs, compactor)
        assert (done.outcome, done.stage_savings) == (Outcome.NOOP, {})


class Wordy:
    """A summarizer whose summary saves less than the summary turn's overhead costs."""

    name = "wordy"

    def __init__(self, overhead: int) -> None:
        self.overhead = overhead

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        words = max(1, request.replaced_tokens - self.overhead // 2)
        return SummaryResult(" ".join(["word"] * words), self.name, words, LlmUsage())


OPENAI_OVERFLOW = (
    "This model's maximum context length is {maximum} tokens. However, your messages resulted in "
    "{actual} tokens. Please reduce the length of the messages."
)
BEDROCK_OVERFLOW = "ValidationException: Input is too long for requested model."


class TestReactive:
    async def _grown(self, turns: TurnHandler, store: Store, count: int = 10) -> int:
        """A conversation under the normal target; returns its estimate."""
        for event in conversation(count):
            await turns.handle(event, b"c")
        return (await store.meta("c")).total_tokens

    async def test_overflow_turn_records_its_estimate_and_calibrates(self, parts: Any) -> None:
        """The provider's count of the rejected prompt moves the factor toward it; the job keeps the estimate."""
        turns, _, store, _ = parts
        estimate = await self._grown(turns, store)
        error = OPENAI_OVERFLOW.format(maximum=1000, actual=2 * estimate)
        outcome = await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": error}), b"c")
        assert outcome.scheduled is Trigger.REACTIVE
        job = await store.job("c")
        assert (job.trigger, job.estimate) == (Trigger.REACTIVE, estimate)
        assert (await store.meta("c")).calibration == pytest.approx(calibrate(1.0, estimate, 2 * estimate))

    async def test_numbers_set_the_target_and_the_scale(self, parts: Any, published: Published) -> None:
        """The parsed maximum lowers the target and the observed ratio sizes the compaction."""
        turns, compactor, store, jobs = parts
        estimate = await self._grown(turns, store)
        actual, maximum = int(estimate * 1.5), 1200
        error = OPENAI_OVERFLOW.format(maximum=maximum, actual=actual)
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": error}), b"c")
        done = await compact_now(jobs, compactor)
        _, budget = budget_for("gpt-4o-mini", Settings().budget, 2048, None)
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.target == budget.reactive_target(maximum) < budget.target
        assert abs(done.tokens_before - actual) <= 1  # reported in the provider's units
        assert (await store.meta("c")).total_tokens * 1.5 <= done.target

    async def test_under_the_target_without_numbers_still_compacts(
        self, parts: Any, settings: Settings
    ) -> None:
        """The provider's refusal overrides an estimate that says the history already fits."""
        turns, compactor, store, jobs = parts
        settings.tail.max_messages = 2  # leaves a head worth summarizing in a short conversation
        estimate = await self._grown(turns, store)
        _, budget = budget_for("gpt-4o-mini", Settings().budget, 2048, None)
        assert estimate < budget.target
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c")
        done = await compact_now(jobs, compactor)
        assert (done.trigger, done.outcome) == (Trigger.REACTIVE, Outcome.COMPACTED), done.error
        assert done.target == budget.target
        assert done.tokens_after < done.tokens_before
        assert (await store.meta("c")).version == 1

    async def test_a_forced_run_that_would_grow_the_history_commits_nothing(
        self, parts: Any, settings: Settings, published: Published
    ) -> None:
        """When the summary turn costs more than the span it replaces, the reactive run is a no-op."""
        turns, compactor, store, jobs = parts
        await self._grown(turns, store)
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c")
        wordy = Compactor(
            settings, store, compactor.locks, jobs, published, summarizers=lambda _m, _c: [Wordy(overhead())]
        )
        done = await compact_now(jobs, wordy)
        assert done.outcome is Outcome.NOOP
        assert done.error is not None
        assert "would not shrink" in done.error
        assert done.tokens_after == done.tokens_before
        assert (await store.meta("c")).version == 0
