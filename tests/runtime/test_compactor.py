"""One compaction run against real Redis: commit, busy lock, no-op, stage savings, reactive mode."""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.bench.agent_data import agent_turn
from compaction_worker.budget.economics import Prices
from compaction_worker.budget.tokens import budget_for, calibrate
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionStarted,
    ContextStatus,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.contracts.history import Entry, render, summary_message_text, text_of
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.compactor import Compactor, context_status, llm_failed
from compaction_worker.runtime.pool import run_job
from compaction_worker.runtime.turns import TurnHandler
from compaction_worker.settings import Settings
from compaction_worker.state.archive import Archive, ArchivedArtifact
from compaction_worker.state.breaker import BreakerState
from compaction_worker.state.index import now_ms
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.store import Store, snapshot_of
from compaction_worker.strategies import CompactionResult, Draft, provider_problems
from compaction_worker.summaries.contract import SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import turn_bytes
from tests.orchestration import (
    Parts,
    Published,
    assistant,
    compact_now,
    compactor_with,
    conversation,
    make_parts,
    overhead,
    rules_conversation,
    user,
)

pytestmark = pytest.mark.integration


class TestCompactor:
    async def test_compaction_commits_and_reports(self, parts: Parts, published: Published) -> None:
        """References 000 and 003: a due job compacts under the target, commits the conversation's effective history, and publishes consistent events with the sizes before and after."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        completed = await run_job(parts.jobs, parts.compactor, "c")
        assert completed is not None
        assert completed.outcome is Outcome.COMPACTED
        (started,) = [CompactionStarted.model_validate(e) for e in published.on("compaction.started")]
        (done,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert started.compaction_id == done.compaction_id
        assert started.tokens_before == done.tokens_before > done.tokens_after
        assert done.tokens_after <= done.target
        snapshot = await parts.store.snapshot("c")
        assert snapshot.meta.version == done.version == 1
        assert snapshot.meta.total_tokens <= done.target
        assert provider_problems(render(snapshot.history)) == []
        covered = {n for c in snapshot.history.chunks for n in range(c.first_n, c.last_n + 1) if c.covers(n)}
        assert covered | {e.n for e in snapshot.history.entries} == set(range(1, 25))
        assert await parts.jobs.job("c") is None

    async def test_a_commit_leaves_the_verbatim_tail_where_the_transcript_holds_it(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The draft's last entries that are the snapshot's unedited transcript records are not
        written to the entries list again: the commit moves ``tail`` to the first of them, and the
        history reads back as the draft committed, turns appended during the compaction after it."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        committed: list[tuple[Entry, ...]] = []
        commit = parts.store.commit

        async def appending_first(cid: str, **kwargs: Any) -> Any:
            committed.append((*kwargs["entries"],))
            await parts.turns.handle(turn_bytes("c", 25, [user("one more question")]), b"c")
            return await commit(cid, **kwargs)

        monkeypatch.setattr(parts.store, "commit", appending_first)
        completed = await run_job(parts.jobs, parts.compactor, "c")
        assert completed is not None
        assert completed.outcome is Outcome.COMPACTED
        snapshot = await parts.store.snapshot("c")
        listed, tail = snapshot.listed, snapshot.meta.tail
        (written,) = committed

        assert snapshot.history.entries[:listed] == written  # only what the list did not hold
        in_transcript = snapshot.history.entries[listed:]
        assert [e.n for e in in_transcript] == list(range(tail + 1, snapshot.meta.msg_count + 1))
        assert len(in_transcript) >= 2
        assert in_transcript[-1].message["content"] == "one more question"
        assert all(e.edit is None for e in in_transcript)

    def test_only_an_unedited_suffix_stays_in_the_transcript(self) -> None:
        tail = tuple(Entry(n, n, {"role": "user", "content": f"m{n}"}, 3) for n in range(5, 9))
        snapshot = snapshot_of(Meta(tail=4, msg_count=8), [], [], [e.to_json() for e in tail])
        edited = replace(tail[-1], edit="cleared")

        assert snapshot.in_transcript(tail[1:]) == 3
        assert snapshot.in_transcript((*tail[:2], edited)) == 0
        assert snapshot.in_transcript((*tail[:3], tail[3], tail[3])) == 1  # not in order: only the last
        assert snapshot.in_transcript(()) == 0

    async def test_a_commit_reports_its_cost_and_break_even_at_the_models_prices(
        self, parts: Parts, published: Published
    ) -> None:
        """Issue 36: the tokens removed, what the next call rewrites in the provider's cache, and
        after how many calls the compaction has paid for that (the conversation's model is priced)."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        await run_job(parts.jobs, parts.compactor, "c")
        (done,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        meta = await parts.store.meta("c")
        prices = Prices.of(meta.model)
        assert prices is not None
        cost = done.cost

        assert cost is not None
        assert cost.tokens_removed == done.tokens_before - done.tokens_after > 0
        # The summary is the history's second message: everything after the system prompt is new.
        assert 0 < cost.cache_write_tokens <= done.tokens_after
        assert cost.saving_per_call == pytest.approx(cost.tokens_removed * prices.cached)
        assert cost.cache_write_cost == pytest.approx(
            cost.cache_write_tokens * (prices.uncached - prices.cached)
        )
        assert cost.cache_write_cost is not None
        assert cost.saving_per_call is not None
        assert cost.break_even_calls == pytest.approx(
            (cost.cache_write_cost + (done.llm_usage.cost_usd or 0.0)) / cost.saving_per_call
        )

    async def test_busy_lock_postpones(self, parts: Parts, redis_client: redis.asyncio.Redis) -> None:
        """Reference 003 (Decision 10, a per-conversation lock): when another worker holds the lock, the job is postponed until that lock would expire, not run twice."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        other = await Locks(redis_client, 30).acquire("c", parts.store.keys("c"))
        assert isinstance(other, Lease)
        assert await run_job(parts.jobs, parts.compactor, "c") is None
        assert await parts.jobs.job("c") is not None
        assert await parts.jobs.due(5) == []
        score = await parts.jobs.index.score("c")
        assert score is not None
        assert score > now_ms() + 29_000

    async def test_noop_is_not_retried_in_a_loop(self, parts: Parts, published: Published) -> None:
        """Reference 000 (no-op rejection): a compaction that cannot shrink commits nothing and blocks re-triggering (docs/design.md, invariant 5)."""
        # The system prompt alone is over the target: no stage can reach it.
        await parts.turns.handle(
            turn_bytes("c", 1, [user("hi")], system_prompt="rule " * 900, context_window=1024), b"c"
        )
        completed = await run_job(parts.jobs, parts.compactor, "c")
        assert completed is not None
        assert completed.outcome is Outcome.NOOP
        assert (await parts.store.meta("c")).version == 0
        outcome = await parts.turns.handle(turn_bytes("c", 2, [assistant("ok")], context_window=1024), b"c")
        assert outcome.scheduled is None

    async def test_started_is_published_before_the_summarizer_is_asked(
        self, parts: Parts, settings: Settings, published: Published
    ) -> None:
        """Reference 003 (Decision 11): compaction.started goes out before the summarization call, completed after it."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        seen: list[tuple[int, int]] = []  # (started, completed) events when the summarizer was asked

        class Watched(ExtractiveSummarizer):
            async def summarize(self, request: SummaryRequest) -> SummaryResult:
                seen.append(
                    (len(published.on("compaction.started")), len(published.on("compaction.completed")))
                )
                return await super().summarize(request)

        watched = compactor_with(parts, published, lambda _m, c: [Watched(c.text)])
        done = await compact_now(parts.jobs, watched)
        assert done.outcome is Outcome.COMPACTED
        assert seen == [(1, 0)]
        assert len(published.on("compaction.completed")) == 1

    async def test_context_status_says_whether_the_model_sees_a_reduced_history(self, parts: Parts) -> None:
        """Reference 003 and issue 9: "summarized" as soon as anything the model saw was replaced, cleared tool outputs included; the stages say what."""
        await parts.turns.handle(turn_bytes("p", 1, [user("read the four files")], context_window=2048), b"p")
        for k, word in enumerate(["alpha", "bravo", "charlie", "delta"], start=2):
            call = {"id": f"c{k}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
            read: list[dict[str, Any]] = [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": f"{word} " * 300},
            ]
            await parts.turns.handle(turn_bytes("p", k, list(read), context_window=2048), b"p")
        await parts.turns.handle(turn_bytes("p", 6, [user("thanks")], context_window=2048), b"p")
        assert (await parts.store.meta("p")).context_status.value == "full"
        pruned = await compact_now(parts.jobs, parts.compactor, "p")
        assert (pruned.outcome, pruned.stages) == (Outcome.COMPACTED, ["prune"])
        assert not (await parts.store.snapshot("p")).history.chunks
        assert (
            pruned.context_status.value == (await parts.store.meta("p")).context_status.value == "summarized"
        )
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        summarized = await compact_now(parts.jobs, parts.compactor)
        assert "summarize" in summarized.stages
        assert (
            summarized.context_status.value
            == (await parts.store.meta("c")).context_status.value
            == "summarized"
        )

    async def test_completed_reports_the_messages_and_the_summary(self, parts: Parts) -> None:
        """Reference 001 (the compaction event: what was dropped, the summary) and 004 (CompactionResult): compaction.completed reports both."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        before = await parts.store.snapshot("c")
        done = await compact_now(parts.jobs, parts.compactor)
        after = await parts.store.snapshot("c")
        assert (done.messages_before, done.messages_after) == (
            len(render(before.history)),
            len(render(after.history)),
        )
        assert done.messages_after < done.messages_before
        assert done.summary_tokens == sum(c.tokens for c in after.history.chunks) > 0
        assert done.summarizer_model == "extractive"
        assert done.summary is None  # the text only when the worker is set to send it (off by default)


class TestStageSavings:
    async def test_savings_account_for_the_tokens_saved(self, parts: Parts) -> None:
        """Reference 004 (CompactionResult: stages used, tokens saved): each reported stage has its saving; together they explain before minus after."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        done = await compact_now(parts.jobs, parts.compactor)
        assert done.outcome is Outcome.COMPACTED
        assert set(done.stage_savings) <= set(done.stages)
        assert done.stage_savings["summarize"] > 0
        # The first chunk brings the summary turn's own overhead with it.
        assert sum(done.stage_savings.values()) - overhead() == done.tokens_before - done.tokens_after

    async def test_noop_saves_nothing(self, parts: Parts) -> None:
        """A compaction that commits nothing reports no savings."""
        await parts.turns.handle(
            turn_bytes("c", 1, [user("hi")], system_prompt="rule " * 900, context_window=1024), b"c"
        )
        done = await compact_now(parts.jobs, parts.compactor)
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

    async def test_overflow_turn_records_its_estimate_and_calibrates(self, parts: Parts) -> None:
        """The provider's count of the rejected prompt moves the factor toward it; the job keeps the estimate."""
        estimate = await self._grown(parts.turns, parts.store)
        error = OPENAI_OVERFLOW.format(maximum=1000, actual=2 * estimate)
        outcome = await parts.turns.handle(
            turn_bytes("c", 11, [], compaction={"mode": "overflow", "error": error}), b"c"
        )
        assert outcome.scheduled is Trigger.REACTIVE
        job = await parts.jobs.job("c")
        assert job is not None
        assert (job.trigger, job.estimate) == (Trigger.REACTIVE, estimate)
        assert (await parts.store.meta("c")).calibration == pytest.approx(
            calibrate(1.0, estimate, 2 * estimate)
        )

    async def test_numbers_set_the_target_and_the_scale(self, parts: Parts, published: Published) -> None:
        """Reference 002 (reactive: the gap parsed from the error): the parsed maximum lowers the target and the observed ratio sizes the compaction."""
        estimate = await self._grown(parts.turns, parts.store)
        actual, maximum = int(estimate * 1.5), 1200
        error = OPENAI_OVERFLOW.format(maximum=maximum, actual=actual)
        await parts.turns.handle(
            turn_bytes("c", 11, [], compaction={"mode": "overflow", "error": error}), b"c"
        )
        done = await compact_now(parts.jobs, parts.compactor)
        _, claimed = budget_for("gpt-4o-mini", Settings().budget, 2048, None)
        # The stated maximum becomes the window (and sets the reserve), then the reactive target.
        _, budget = budget_for("gpt-4o-mini", Settings().budget, 2048, None, maximum)
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.window == maximum
        assert done.target == budget.reactive_target(maximum) < claimed.target
        assert abs(done.tokens_before - actual) <= 1  # reported in the provider's units
        assert (await parts.store.meta("c")).total_tokens * 1.5 <= done.target

    async def test_under_the_target_without_numbers_still_compacts(
        self, parts: Parts, settings: Settings
    ) -> None:
        """References 002 and 004 (reactive compaction): the provider's refusal overrides an estimate that says the history already fits."""
        settings.tail.max_messages = 2  # leaves a head worth summarizing in a short conversation
        estimate = await self._grown(parts.turns, parts.store)
        _, budget = budget_for("gpt-4o-mini", Settings().budget, 2048, None)
        assert estimate < budget.target
        await parts.turns.handle(
            turn_bytes("c", 11, [], compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c"
        )
        done = await compact_now(parts.jobs, parts.compactor)
        assert (done.trigger, done.outcome) == (Trigger.REACTIVE, Outcome.COMPACTED), done.error
        assert done.target == budget.target
        assert done.tokens_after < done.tokens_before
        assert (await parts.store.meta("c")).version == 1

    async def test_a_forced_run_that_would_grow_the_history_commits_nothing(
        self, parts: Parts, settings: Settings, published: Published
    ) -> None:
        """Reference 000 (no-op rejection): when the summary turn costs more than the span it replaces, the reactive run is a no-op."""
        await self._grown(parts.turns, parts.store)
        await parts.turns.handle(
            turn_bytes("c", 11, [], compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c"
        )
        wordy = compactor_with(parts, published, lambda _m, _c: [Wordy(overhead())])
        done = await compact_now(parts.jobs, wordy)
        assert done.outcome is Outcome.NOOP
        assert done.error is not None
        assert "would not shrink" in done.error
        assert done.tokens_after == done.tokens_before
        assert (await parts.store.meta("c")).version == 0


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
    """Issues 4 and 20 (failure policy): N failed LLM runs in a row open the model's breaker."""

    async def _forced(
        self, turns: TurnHandler, jobs: JobQueue, compactor: Compactor, seq: int
    ) -> CompactionCompleted:
        await turns.handle(
            turn_bytes("c", seq, [user(f"more {seq} " + "detail " * 80)], compaction={"mode": "force"}), b"c"
        )
        return await compact_now(jobs, compactor)

    async def test_opens_after_n_failures_skips_the_llm_and_closes_on_success(
        self, parts: Parts, settings: Settings, published: Published
    ) -> None:
        settings.summarizer.breaker_failures = 2
        settings.summarizer.breaker_cooldown_seconds = 0.5
        settings.tail.max_messages = 2
        flaky = Flaky()
        breaker = compactor_with(parts, published, lambda _m, c: [flaky, ExtractiveSummarizer(c.text)])
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        seq = 25
        runs = []
        for _ in range(3):
            runs.append(await self._forced(parts.turns, parts.jobs, breaker, seq))
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
        assert (await breaker.breaker.peek("flaky-llm")).open

        # After the cooldown the LLM is asked again; a success closes the breaker.
        await asyncio.sleep(0.6)
        flaky.failing = False
        healed = await self._forced(parts.turns, parts.jobs, breaker, seq)
        assert (healed.outcome, healed.llm_failures, healed.circuit_open) == (Outcome.COMPACTED, 0, False)
        assert healed.summarizer_model == "flaky-llm"
        assert flaky.calls == 3
        assert await breaker.breaker.peek("flaky-llm") == BreakerState(0, False)
        events = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert [e.circuit_open for e in events] == [False, False, True, False]


def test_context_status_of_a_draft() -> None:
    """Edited messages (pruned, de-duplicated, truncated) reduce the history as a chunk does; made-up ones do not."""
    chat = [
        Entry(n=1, seq=1, message=user("hi"), tokens=3),
        Entry(n=2, seq=2, message=assistant("ok"), tokens=3),
    ]
    made_up = Entry(n=0, seq=2, message=user("(continued)"), tokens=3, edit="synthetic")
    assert context_status(Draft((), (*chat, made_up))) is ContextStatus.FULL
    for edit in ("pruned", "deduplicated", "truncated"):
        edited = replace(chat[1], edit=edit)
        assert context_status(Draft((), (chat[0], edited))) is ContextStatus.SUMMARIZED


def test_breaker_count_changes_only_when_the_llm_was_asked() -> None:
    """The count moves on an LLM run only: not while open, not without a fallback, not when no summary ran."""
    base = CompactionResult(Outcome.COMPACTED, Draft((), ()), 10, 5, 2, 1)
    failed = replace(base, summarizers_tried=2, summarizer_failures=1)
    worked = replace(base, summarizers_tried=1)
    assert llm_failed(failed, summarizers=2, circuit_open=False) is True
    assert llm_failed(worked, summarizers=2, circuit_open=False) is False
    assert llm_failed(failed, summarizers=1, circuit_open=True) is None
    assert llm_failed(failed, summarizers=1, circuit_open=False) is None
    assert llm_failed(base, summarizers=2, circuit_open=False) is None


class Forgetful:
    """A summarizer that keeps no identifier at all: a generic sentence."""

    name = "forgetful"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = "The team worked on the services and discussed the next steps."
        return SummaryResult(text, self.name, 12, LlmUsage())


def mentions(seq: int) -> str:
    """A turn naming artifacts in prose, as people write them."""
    return (
        f"turn {seq}: I ran `kubectl rollout restart deployment/svc-{seq} -n prod` and saw error: "
        f"ECONNREFUSED 10.0.3.{seq}:5012 twice, so I opened ticket INC-{40000 + seq}. " + "detail " * 40
    )


async def compact_mentions(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published, ledger: int | None = None
) -> tuple[CompactionCompleted, Parts]:
    """Conversation "a": 24 turns naming artifacts in prose on a 2K window, compacted once by ``Forgetful``.

    ``ledger`` sets the ledger's budget (0: no ledger); by default the settings' own.
    """
    if ledger is not None:
        pipeline = settings.pipeline.model_copy(
            update={"artifact_budget_tokens": ledger, "artifact_budget_fraction": 0}
        )
        settings = settings.model_copy(update={"pipeline": pipeline})
    parts = make_parts(redis_client, settings, published, summarizers=lambda _m, _c: [Forgetful()])
    for seq in range(1, 25):
        message = user(mentions(seq)) if seq % 2 else assistant(mentions(seq))
        await parts.turns.handle(turn_bytes("a", seq, [message], context_window=2048), b"a")
    done = await compact_now(parts.jobs, parts.compactor, "a")
    assert done.outcome is Outcome.COMPACTED, done.error
    return done, parts


class TestArchive:
    """Issue 9: nothing is dropped silently; every artifact stays retrievable and the event counts the lost."""

    async def _compacted(
        self, redis_client: redis.asyncio.Redis, settings: Settings, published: Published, ledger: int
    ) -> tuple[CompactionCompleted, Store, Archive]:
        done, parts = await compact_mentions(redis_client, settings, published, ledger)
        return done, parts.store, parts.archive

    async def test_what_no_ledger_keeps_is_archived_and_counted(
        self, redis_client: redis.asyncio.Redis, settings: Settings, published: Published
    ) -> None:
        """Without a ledger the summary loses every artifact: all are archived, all counted as dropped."""
        done, store, archive = await self._compacted(redis_client, settings, published, ledger=0)
        history = (await store.snapshot("a")).history
        covered = [n for c in history.chunks for n in range(c.first_n, c.last_n + 1) if c.covers(n)]
        archived = {a.item: a for a in await archive.all("a")}
        for n in covered:
            assert f"cmd: kubectl rollout restart deployment/svc-{n} -n prod" in archived
            assert f"id: INC-{40000 + n}" in archived
            assert archived[f"id: INC-{40000 + n}"].seq == n
        assert done.artifacts_dropped == len(archived) >= 3 * len(covered) > 0
        (event,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert event.artifacts_dropped == done.artifacts_dropped

    async def test_what_the_ledger_keeps_is_not_counted(
        self, redis_client: redis.asyncio.Redis, settings: Settings, published: Published
    ) -> None:
        """With a ledger, what it carries verbatim is not counted: the count is what the history lacks."""
        done, store, archive = await self._compacted(redis_client, settings, published, ledger=400)
        history = (await store.snapshot("a")).history
        shown = "\n".join(text_of(m) for m in render(history))
        archived = await archive.all("a")
        # The error's core is its errno and address; the other kinds are their own core.
        cores = {a.item: re.sub(r"^error: | twice$", "", a.text) for a in archived}
        lacking = [a for a in archived if not re.search(re.escape(cores[a.item]) + r"(?![\w])", shown)]
        assert 0 < done.artifacts_dropped == len(lacking) < len(archived)

    async def test_the_count_is_exactly_what_the_history_lost_of_what_was_said(
        self, redis_client: redis.asyncio.Redis, settings: Settings, published: Published
    ) -> None:
        """Issue 19: items of kinds no extractor names, stated once each; the count is those the history lost.

        The ground truth is what the test planted; every lost item is retrievable from the
        archive, marked as no longer in the history.
        """
        rng = random.Random(19)

        def word() -> str:
            return "".join(rng.choices(("ka", "lo", "mi", "ren", "zu", "pe", "sor", "nex", "bri"), k=3))

        shapes = (
            lambda: f"{word().upper()}_{word().upper()}={word()}",
            lambda: f"{word()}@{word()}.io",
            lambda: f"{word().capitalize()} {word().capitalize()}",
            lambda: f"{word()}/{word()}:{rng.randint(10, 99)}.{rng.randint(0, 9)}",
            lambda: f"X-{word().capitalize()}-{word().capitalize()}",
        )
        pipeline = settings.pipeline.model_copy(
            update={"artifact_budget_tokens": 60, "artifact_budget_fraction": 0}
        )
        parts = make_parts(
            redis_client,
            settings.model_copy(update={"pipeline": pipeline}),
            published,
            lambda _m, _c: [Forgetful()],
        )
        planted: list[str] = []
        for seq in range(1, 25):
            item = shapes[seq % len(shapes)]()
            planted.append(item)
            text = f"please note that it is {item} for this one, " + "and so on " * 40
            message = user(text) if seq % 2 else assistant(text)
            # A small window: the identifiers outgrow what the history can hold beside the newest turns.
            await parts.turns.handle(turn_bytes("u", seq, [message], context_window=1200), b"u")
        done = await compact_now(parts.jobs, parts.compactor, "u")
        assert done.outcome is Outcome.COMPACTED, done.error

        shown = "\n".join(text_of(m) for m in await Client(settings, parts.store, None).messages("u"))
        lost = {item for item in planted if item not in shown}
        found = await Client(settings, parts.store, None).artifacts("u")
        assert 0 < done.artifacts_dropped == len(lost) < len(planted)
        assert {a.text.split(" \u2014 ")[0] for a in found if not a.in_history} == lost

    async def test_archiving_twice_keeps_the_first_sighting(self, redis_client: redis.asyncio.Redis) -> None:
        """A retried compaction writes the same archive: an item keeps where it was first seen."""
        archive = Archive(redis_client, "t")
        deadline = int(time.time() * 1000) + 60_000  # the conversation's (lua/expiry.lua)
        await redis_client.hset(conversation_keys("x", "t").meta, "expires_at", deadline)
        first = ArchivedArtifact("path: src/a.py", 3, 5)
        await archive.add("x", [first])
        await archive.add(
            "x", [ArchivedArtifact("path: src/a.py", 9, 17), ArchivedArtifact("id: AB-1", 9, 17)]
        )
        assert await archive.all("x") == [first, ArchivedArtifact("id: AB-1", 9, 17)]
        assert await redis_client.pexpiretime(archive.key("x")) == deadline


@pytest.mark.integration
async def test_two_compactions_in_a_row_leave_the_prompt_prefix_through_the_earlier_chunks_byte_identical(
    parts: Parts, settings: Settings
) -> None:
    """Issue 36: the task comes before the summary turn and a compaction adds a chunk after the
    earlier ones, so the prompt up to the end of those stays byte-identical (what a provider's cache serves), unless it had to fold them, which
    its stages say. Agent-shaped steps on a 128K window, where chunks have room to accumulate."""

    def step(i: int) -> list[bytes]:
        prompt = "You are the team's SRE agent."
        return [turn_bytes("c", 2 * i - 1, agent_turn(i)[:4], context_window=128_000, system_prompt=prompt),
                turn_bytes("c", 2 * i, agent_turn(i)[4:], context_window=128_000, system_prompt=prompt)]  # fmt: skip

    settings.pipeline.prune = False  # agent steps' tool outputs would be pruned first: summaries wanted
    renders: list[list[dict[str, Any]]] = []
    stages: list[list[str]] = []
    i = 0
    while len(renders) < 2:
        i += 1
        for raw in step(i):
            await parts.turns.handle(raw, b"c")
        if await parts.jobs.job("c") is not None:
            done = await run_job(parts.jobs, parts.compactor, "c")
            assert done is not None
            assert done.outcome is Outcome.COMPACTED, done.error
            stages.append(done.stages)
            renders.append(render((await parts.store.snapshot("c")).history))
    first, second = renders
    earlier = (await parts.store.snapshot("c")).history.chunks[:-1]

    assert "summarize" in stages[0]
    assert "summarize" in stages[1]
    assert "fold" not in stages[1], "a fold would rewrite the earlier chunks (and say so): nothing to test"
    assert len(earlier) >= 1
    shared = summary_message_text(earlier)
    assert first[0] == second[0]  # the system prompt
    assert first[1] == second[1]  # the task, where it was said: before the summary
    assert first[1]["content"].startswith("Turn 1:")
    assert first[2]["content"].startswith(shared)
    assert second[2]["content"].startswith(shared + "\n\n")


class TestAPayingCompaction:
    """docs/design.md, invariant 14: a threshold compaction saves its share or brings the history
    under its window, runs once a turn, and does not fire every turn over a floor."""

    async def test_one_that_saves_too_little_commits_nothing_says_why_and_waits_for_growth(
        self, parts: Parts, published: Published
    ) -> None:
        """The system prompt (~950 tokens) is over the target: the run can only end under the
        threshold, a few percent below where it started."""
        first, second, third = rules_conversation(950, 3)
        await parts.turns.handle(first, b"c")
        assert (await parts.turns.handle(second, b"c")).scheduled is Trigger.THRESHOLD
        before = await parts.store.meta("c")
        done = await compact_now(parts.jobs, parts.compactor)

        assert done.outcome is Outcome.NOOP
        assert done.error is not None
        assert re.match(
            r"it would save \d+ of 1,255 tokens \(\d\.\d%\), under the minimum 10% for a history within "
            r"its window \(1,536 tokens\): nothing committed; compactions end at 1,[12]\d\d tokens here, over "
            r"the target \(768\).*; no threshold compaction before 1,3\d\d tokens$",
            done.error,
        ), done.error
        assert (done.tokens_after, done.stages, done.notes) == (done.tokens_before, [], [])
        meta = await parts.store.meta("c")
        assert meta.version == before.version == 0
        assert meta.noop_tokens == done.tokens_before == 1255
        assert 1228 - 50 < meta.floor_tokens <= 1228  # where the run ended: under the threshold
        assert published.on("compaction.completed")[-1]["error"] == done.error
        # The next turn takes the history past the floor's level: a run from there pays.
        assert (await parts.turns.handle(third, b"c")).scheduled is Trigger.THRESHOLD
        after = await compact_now(parts.jobs, parts.compactor)
        assert after.outcome is Outcome.COMPACTED, after.error
        assert after.tokens_before - after.tokens_after >= 0.1 * after.tokens_before

    async def test_a_commit_that_ends_over_its_threshold_runs_no_second_time_on_its_turn(
        self, parts: Parts, published: Published
    ) -> None:
        """The prompt (~1,050 tokens) leaves the run room only under the window: it ends over the
        threshold, and nothing is scheduled until the next turn, which a run then follows only
        when it takes the history over its window."""
        for event in rules_conversation(1050, 4):
            outcome = await parts.turns.handle(event, b"c")
            while await parts.jobs.due(5):
                await compact_now(parts.jobs, parts.compactor)
        assert outcome.scheduled is Trigger.THRESHOLD
        done = CompactionCompleted.model_validate(published.on("compaction.completed")[-1])
        assert done.outcome is Outcome.COMPACTED, done.error
        assert 1228 < done.tokens_after <= 1536  # over the threshold, under the window
        meta = await parts.store.meta("c")
        assert (meta.compacted_seq, meta.floor_tokens) == (4, done.tokens_after)
        assert await parts.jobs.job("c") is None  # before invariant 14: a second run at once
        assert done.notes[-1].endswith(
            "moves up to what the window leaves, 1,536 tokens: it compacts when the history reaches its window"
        )

    async def test_turns_appended_while_it_ran_schedule_the_next_run(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After a commit the conversation's next run waits for a turn, unless one arrived while it
        ran: its snapshot's turn is what the commit marks, not the last one stored."""
        for event in conversation(24):
            await parts.turns.handle(event, b"c")
        running = await parts.jobs.job("c")
        assert running is not None
        commit = parts.store.commit

        async def appending_first(cid: str, **kwargs: Any) -> Any:
            long = turn_bytes("c", 25, [user("and now: " + "detail " * 560)], context_window=2048)
            await parts.turns.handle(long, b"c")
            pending = await parts.jobs.job("c")  # the running one: the turn recorded none of its own
            assert pending is not None
            assert pending.id == running.id
            return await commit(cid, **kwargs)

        monkeypatch.setattr(parts.store, "commit", appending_first)
        done = await compact_now(parts.jobs, parts.compactor)
        assert done.outcome is Outcome.COMPACTED
        meta = await parts.store.meta("c")
        assert (meta.compacted_seq, meta.last_seq) == (24, 25)
        assert 1228 <= meta.total_tokens <= 1536  # the turn took it over the threshold again
        job = await parts.jobs.job("c")
        assert job is not None
        assert (job.trigger, job.id != running.id) == (Trigger.THRESHOLD, True)
