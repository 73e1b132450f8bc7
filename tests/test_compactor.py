"""One compaction run against real Redis: commit, busy lock, no-op, stage savings, reactive mode."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.compactor import Compactor, next_llm_failures
from compaction_worker.errors import SummarizerError
from compaction_worker.events import (
    CompactionCompleted,
    CompactionStarted,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.extractive import ExtractiveSummarizer
from compaction_worker.history import render
from compaction_worker.jobs import JobQueue
from compaction_worker.lock import Locks
from compaction_worker.settings import Settings
from compaction_worker.store import Store
from compaction_worker.strategies import CompactionResult, Draft, provider_problems
from compaction_worker.summarizer import SummaryRequest, SummaryResult
from compaction_worker.tokens import budget_for, calibrate
from compaction_worker.turns import TurnHandler
from tests.orchestration import Published, assistant, compact_now, conversation, overhead, raw, user

pytestmark = pytest.mark.integration


class TestCompactor:
    async def test_compaction_commits_and_reports(self, parts: Any, published: Published) -> None:
        """References 000 and 003: a due job compacts under the target, commits the conversation's effective history, and publishes consistent events with the sizes before and after."""
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
        """Reference 003 (Decision 10, a per-conversation lock): when another worker holds the lock, the job is postponed, not run twice."""
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
        """Reference 000 (no-op rejection): a compaction that cannot shrink commits nothing and blocks re-triggering (invariant 5)."""
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

    async def test_started_is_published_before_the_summarizer_is_asked(
        self, parts: Any, settings: Settings, published: Published
    ) -> None:
        """Reference 003 (Decision 11): compaction.started goes out before the summarization call, completed after it."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        seen: list[tuple[int, int]] = []  # (started, completed) events when the summarizer was asked

        class Watched(ExtractiveSummarizer):
            async def summarize(self, request: SummaryRequest) -> SummaryResult:
                seen.append(
                    (len(published.on("compaction.started")), len(published.on("compaction.completed")))
                )
                return await super().summarize(request)

        watched = Compactor(
            settings, store, compactor.locks, jobs, published, summarizers=lambda _m, c: [Watched(c.text)]
        )
        done = await compact_now(jobs, watched)
        assert done.outcome is Outcome.COMPACTED
        assert seen == [(1, 0)]
        assert len(published.on("compaction.completed")) == 1

    async def test_context_status_says_whether_a_summary_is_in_effect(self, parts: Any) -> None:
        """Reference 003 (Decision 7): context_status stays "full" when only tool outputs were cleared, "summarized" once a summary is in effect."""
        turns, compactor, store, jobs = parts
        await turns.handle(raw("p", 1, user("read the four files"), context_window=2048), b"p")
        for k, word in enumerate(["alpha", "bravo", "charlie", "delta"], start=2):
            call = {"id": f"c{k}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
            read: list[dict[str, Any]] = [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": f"{word} " * 300},
            ]
            await turns.handle(raw("p", k, *read, context_window=2048), b"p")
        await turns.handle(raw("p", 6, user("thanks"), context_window=2048), b"p")
        pruned = await compact_now(jobs, compactor, "p")
        assert (pruned.outcome, pruned.stages) == (Outcome.COMPACTED, ["prune"])
        assert pruned.context_status.value == (await store.meta("p")).context_status.value == "full"
        for event in conversation(24):
            await turns.handle(event, b"c")
        summarized = await compact_now(jobs, compactor)
        assert "summarize" in summarized.stages
        assert summarized.context_status.value == (await store.meta("c")).context_status.value == "summarized"

    async def test_completed_reports_the_messages_and_the_summary(self, parts: Any) -> None:
        """Reference 001 (the compaction event: what was dropped, the summary) and 004 (CompactionResult): compaction.completed reports both."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        before = await store.snapshot("c")
        done = await compact_now(jobs, compactor)
        after = await store.snapshot("c")
        assert (done.messages_before, done.messages_after) == (
            len(render(before.history)),
            len(render(after.history)),
        )
        assert done.messages_after < done.messages_before
        assert done.summary_tokens == sum(c.tokens for c in after.history.chunks) > 0
        assert done.summarizer_model == "extractive"


class TestStageSavings:
    async def test_savings_account_for_the_tokens_saved(self, parts: Any) -> None:
        """Reference 004 (CompactionResult: stages used, tokens saved): each reported stage has its saving; together they explain before minus after."""
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
        """Reference 002 (reactive: the gap parsed from the error): the parsed maximum lowers the target and the observed ratio sizes the compaction."""
        turns, compactor, store, jobs = parts
        estimate = await self._grown(turns, store)
        actual, maximum = int(estimate * 1.5), 1200
        error = OPENAI_OVERFLOW.format(maximum=maximum, actual=actual)
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": error}), b"c")
        done = await compact_now(jobs, compactor)
        _, claimed = budget_for("gpt-4o-mini", Settings().budget, 2048, None)
        # The stated maximum becomes the window (and sets the reserve), then the reactive target.
        _, budget = budget_for("gpt-4o-mini", Settings().budget, 2048, None, maximum)
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.window == maximum
        assert done.target == budget.reactive_target(maximum) < claimed.target
        assert abs(done.tokens_before - actual) <= 1  # reported in the provider's units
        assert (await store.meta("c")).total_tokens * 1.5 <= done.target

    async def test_under_the_target_without_numbers_still_compacts(
        self, parts: Any, settings: Settings
    ) -> None:
        """References 002 and 004 (reactive compaction): the provider's refusal overrides an estimate that says the history already fits."""
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
        """Reference 000 (no-op rejection): when the summary turn costs more than the span it replaces, the reactive run is a no-op."""
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


class Flaky:
    """A primary (LLM) summarizer that fails while ``failing`` is set, and counts its calls."""

    name = "flaky-llm"

    def __init__(self) -> None:
        self.failing = True
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        if self.failing:
            raise SummarizerError("provider unavailable (HTTP 503)")
        text = "The user asked questions; the assistant answered them."
        return SummaryResult(text, self.name, 12, LlmUsage(calls=1))


class TestCircuitBreaker:
    """Issue 4 (failure policy): N failed LLM runs in a row open a per-conversation breaker."""

    async def _forced(
        self, turns: TurnHandler, jobs: JobQueue, compactor: Compactor, seq: int
    ) -> CompactionCompleted:
        await turns.handle(
            raw("c", seq, user(f"more {seq} " + "detail " * 80), compaction={"mode": "force"}), b"c"
        )
        return await compact_now(jobs, compactor)

    async def test_opens_after_n_failures_skips_the_llm_and_closes_on_success(
        self, parts: Any, settings: Settings, published: Published
    ) -> None:
        turns, compactor, store, jobs = parts
        settings.summarizer.breaker_failures = 2
        settings.summarizer.breaker_cooldown_seconds = 0.5
        settings.tail.max_messages = 2
        flaky = Flaky()
        breaker = Compactor(
            settings,
            store,
            compactor.locks,
            jobs,
            published,
            summarizers=lambda _m, c: [flaky, ExtractiveSummarizer(c.text)],
        )
        for event in conversation(24):
            await turns.handle(event, b"c")
        seq = 25
        runs = []
        for _ in range(3):
            runs.append(await self._forced(turns, jobs, breaker, seq))
            seq += 1
        # Two failures (the fallback compacted both times), then the LLM is skipped.
        assert [(r.outcome, r.llm_failures, r.circuit_open) for r in runs] == [
            (Outcome.COMPACTED, 1, False),
            (Outcome.COMPACTED, 2, False),
            (Outcome.COMPACTED, 2, True),
        ]
        assert "provider unavailable" in (runs[0].error or "")
        assert runs[2].summarizer_model == "extractive"
        assert flaky.calls == 2
        assert (await store.meta("c")).breaker_until > 0

        # After the cooldown the LLM is asked again; a success closes the breaker.
        await asyncio.sleep(0.6)
        flaky.failing = False
        healed = await self._forced(turns, jobs, breaker, seq)
        assert (healed.outcome, healed.llm_failures, healed.circuit_open) == (Outcome.COMPACTED, 0, False)
        assert healed.summarizer_model == "flaky-llm"
        assert flaky.calls == 3
        meta = await store.meta("c")
        assert (meta.llm_failures, meta.breaker_until) == (0, 0)
        events = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert [e.circuit_open for e in events] == [False, False, True, False]


def test_breaker_count_changes_only_when_the_llm_was_asked() -> None:
    """The count moves on an LLM run only: not while open, not without a fallback, not when no summary ran."""
    base = CompactionResult(Outcome.COMPACTED, Draft((), ()), 10, 5, 2, 1)
    failed = replace(base, summarizers_tried=2, summarizer_failures=1)
    worked = replace(base, summarizers_tried=1)
    assert next_llm_failures(1, failed, summarizers=2, circuit_open=False) == 2
    assert next_llm_failures(1, worked, summarizers=2, circuit_open=False) == 0
    assert next_llm_failures(1, failed, summarizers=1, circuit_open=True) == 1
    assert next_llm_failures(1, failed, summarizers=1, circuit_open=False) == 1
    assert next_llm_failures(1, base, summarizers=2, circuit_open=False) == 1
