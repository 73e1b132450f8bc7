"""The compaction run end to end over small hand-built histories.

Tail selection is tested in ``tests/strategies/test_tail.py``, repair and the provider
checks in ``tests/strategies/test_repair.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryChunk, render
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies import (
    Limits,
    compact,
    provider_problems,
)
from compaction_worker.summaries.contract import SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.testing import Chat, WordCounter

from .helpers import COUNTER, call, result


def entries(*specs: tuple[str, int] | dict[str, Any], start: int = 1) -> tuple[Entry, ...]:
    """Entries of messages (10 tokens each) or of ``(role, tokens)`` pairs."""
    chat = Chat(start, COUNTER)
    for i, spec in enumerate(specs, start=start):
        message = spec if isinstance(spec, dict) else {"role": spec[0], "content": f"{spec[0]} {i}"}
        chat.add(message, tokens=10 if isinstance(spec, dict) else spec[1])
    return tuple(chat.entries)


class FakeSummarizer:
    """Returns a fixed summary, or raises, and records its requests."""

    def __init__(self, text: str = "the summary", fail: bool = False, name: str = "fake") -> None:
        self.text, self.fail, self.name = text, fail, name
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        if self.fail:
            raise SummarizerError("down")
        return SummaryResult(self.text, self.name, COUNTER.text(self.text), LlmUsage(calls=1, total_tokens=7))


def limits(target: int, **kw: Any) -> Limits:
    defaults: dict[str, Any] = {
        "target": target,
        "fixed_tokens": 0,
        "window": 10_000,
        "tail_max_messages": 4,
        "tail_max_tokens": 1000,
        "max_summary_tokens": 50,
        "chunk_budget": 500,
    }
    defaults.update(kw)
    return Limits(**defaults)


class TestCompact:
    async def test_additive_summary_under_target(self) -> None:
        """References 002, 003 and 004 (the LLM summary): older turns become one chunk; the tail stays verbatim; the result is under target."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        history = EffectiveHistory(chunks=(), entries=es)
        fake = FakeSummarizer()
        out = await compact(history, limits(300), [fake], COUNTER)
        assert out.outcome is Outcome.COMPACTED
        assert out.tokens_after <= 300 < out.tokens_before
        assert [e.n for e in out.draft.entries] == [9, 10, 11, 12]
        chunk = out.draft.chunks[0]
        assert (chunk.first_n, chunk.last_n) == (1, 8)
        assert next(m["content"] for m in fake.requests[0].messages) == "user 1"
        assert provider_problems(render(history.with_parts(out.draft.chunks, out.draft.entries))) == []

    async def test_second_compaction_adds_a_chunk(self) -> None:
        """Reference 003 (additive): a later compaction keeps the first chunk and adds one."""
        first = SummaryChunk("x", "old", 1, 4, 1, 4, 5, "t", "m")
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 4], start=5)
        out = await compact(EffectiveHistory((first,), es), limits(200), [FakeSummarizer()], COUNTER)
        assert next(c.id for c in out.draft.chunks) == "x"
        assert len(out.draft.chunks) == 2
        assert out.draft.chunks[1].first_n == 5

    async def test_chunks_fold_when_over_their_budget(self) -> None:
        """References 003 (recursive fallback) and 000 (an earlier summary is folded in as a summary): chunks that outgrow their budget fold into one."""
        old = tuple(SummaryChunk(str(i), "old " * 40, i, i, i, i, 60, "t", "m") for i in range(1, 4))
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 4], start=4)
        fake = FakeSummarizer()
        out = await compact(EffectiveHistory(old, es), limits(260, chunk_budget=100), [fake], COUNTER)
        assert out.outcome is Outcome.COMPACTED
        assert len(out.draft.chunks) == 1
        assert (out.draft.chunks[0].first_n, out.draft.chunks[0].level) == (1, 1)
        assert len(fake.requests[0].previous_summaries) == 3

    async def test_falls_back_to_the_next_summarizer(self) -> None:
        """A failing LLM hands over to the deterministic fallback; the error is reported."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        out = await compact(
            EffectiveHistory((), es),
            limits(300),
            [FakeSummarizer(fail=True, name="llm"), FakeSummarizer(name="extractive")],
            COUNTER,
        )
        assert out.outcome is Outcome.COMPACTED
        assert out.summarizer == "extractive"
        assert out.error is not None
        assert "llm: down" in out.error

    async def test_truncation_when_every_summarizer_fails(self) -> None:
        """Reference 004 (a failed summary falls through to stage 4): sliding-window truncation leaves a marker chunk covering what it dropped."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        out = await compact(EffectiveHistory((), es), limits(300), [FakeSummarizer(fail=True)], COUNTER)
        assert out.outcome is Outcome.COMPACTED
        assert out.stages == ("truncate",)
        assert "removed" in out.draft.chunks[0].text
        assert out.draft.chunks[0].last_n == out.draft.entries[0].n - 1

    async def test_degrading_guard_shrinks_the_tail_to_zero(self) -> None:
        """Reference 003 (degrading guard): a tail too large for the budget degrades, down to no tail at all."""
        es = entries(("user", 20), ("assistant", 20), ("user", 400))
        out = await compact(EffectiveHistory((), es), limits(100), [FakeSummarizer()], COUNTER)
        assert out.outcome is Outcome.COMPACTED
        assert out.draft.entries == ()
        assert out.draft.chunks[0].last_n == 3

    async def test_noop_when_the_target_is_unreachable(self) -> None:
        """Reference 003 (the system prompt is compaction-proof): when system prompt and tools alone exceed the target, nothing is committed (docs/design.md, invariant 5)."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 3])
        out = await compact(
            EffectiveHistory((), es), limits(100, fixed_tokens=150), [FakeSummarizer()], COUNTER
        )
        assert out.outcome is Outcome.NOOP
        assert out.draft.entries == es
        assert out.error is not None
        assert "system prompt and tool schemas alone (150 tokens) leave no room" in out.error

    async def test_what_must_stay_over_the_target_still_gets_the_history_under_its_ceiling(self) -> None:
        """Issue 33, invariant 5: system prompt and tools over the target but under the threshold: the
        run aims at the threshold instead, commits, and its note says why; with no ceiling it stays a noop."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        history = EffectiveHistory((), es)
        aim = limits(100, fixed_tokens=150, ceilings=(300, 400))
        out = await compact(history, aim, [FakeSummarizer()], COUNTER)
        assert out.outcome is Outcome.COMPACTED, out.error
        assert out.tokens_before > 300 >= out.tokens_after
        assert any("target (100 tokens) is out of reach" in n and "under 300 tokens" in n for n in out.notes)
        over = await compact(
            history, limits(100, fixed_tokens=500, ceilings=(300, 400)), [FakeSummarizer()], COUNTER
        )
        assert over.outcome is Outcome.NOOP
        assert over.error is not None
        assert "nor can it get under 300, 400 tokens" in over.error

    async def test_a_summary_with_no_room_under_the_target_is_written_under_a_ceiling(self) -> None:
        """Issue 33: a pinned message leaves a summary no room under the target; the summary is asked
        again under the next ceiling rather than the sliding window dropping turns unread; with no
        ceiling (a reactive run) the run says that what must stay is too large (invariant 5)."""
        pinned = {"role": "user", "content": "keep this", "pinned": True}
        es = entries(pinned, *[(r, 40) for r in ["assistant", "user"] * 6], ("assistant", 40))
        history = EffectiveHistory((), tuple(replace(e, tokens=285) if e.n == 1 else e for e in es))
        out = await compact(history, limits(300, ceilings=(420, 500)), [FakeSummarizer()], COUNTER)
        assert out.outcome is Outcome.COMPACTED, out.error
        assert "summarize" in out.stages
        assert "truncate" not in out.stages
        assert 300 < out.tokens_after <= 420
        assert any("no room under the target (300 tokens): summarized under 420" in n for n in out.notes)
        reactive = await compact(history, limits(300), [FakeSummarizer()], COUNTER)
        assert reactive.outcome is Outcome.NOOP
        assert reactive.error is not None
        assert "what must stay are too large" in reactive.error

    async def test_under_target_is_noop_unless_forced(self) -> None:
        """References 000 (/compact) and 004 (compactSession): a manual compaction summarizes even below the target."""
        es = entries(*[(r, 10) for r in ["user", "assistant"] * 6])
        history = EffectiveHistory((), es)
        assert (await compact(history, limits(10_000), [FakeSummarizer()], COUNTER)).outcome is Outcome.NOOP
        forced = await compact(history, limits(10_000, force=True), [FakeSummarizer()], COUNTER)
        assert forced.outcome is Outcome.COMPACTED

    async def test_summary_and_sliding_window_can_be_switched_off(self) -> None:
        """Reference 004 (enableSummarize, enableSlidingWindow): a disabled stage is skipped; with neither, nothing is committed."""
        es = entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        history = EffectiveHistory((), es)
        fake = FakeSummarizer()
        no_summary = await compact(
            history, limits(300), [fake], COUNTER, settings=PipelineSettings(summarize=False)
        )
        assert (no_summary.outcome, no_summary.stages) == (Outcome.COMPACTED, ("truncate",))
        assert fake.requests == []
        neither = PipelineSettings(summarize=False, sliding_window=False)
        out = await compact(history, limits(300), [fake], COUNTER, settings=neither)
        assert (out.outcome, out.draft.entries, out.draft.chunks) == (Outcome.NOOP, es, ())

    async def test_a_chunk_records_its_turns_size_time_and_model(self) -> None:
        """Reference 003 (Decision 8, summary storage): a chunk keeps the turns it covers, its tokens, when it was made and the model that wrote it."""
        # Two messages per turn, so turn numbers differ from message ordinals.
        es = tuple(
            replace(e, seq=(e.n + 1) // 2) for e in entries(*[(r, 40) for r in ["user", "assistant"] * 6])
        )
        before = datetime.now(UTC)
        out = await compact(
            EffectiveHistory((), es), limits(300), [FakeSummarizer(name="summary-model")], COUNTER
        )
        (chunk,) = out.draft.chunks
        expected = (1, 4, 1, 8, COUNTER.text(chunk.render_text()), "summary-model")

        assert expected == (
            chunk.first_seq,
            chunk.last_seq,
            chunk.first_n,
            chunk.last_n,
            chunk.tokens,
            chunk.model,
        )
        assert before <= datetime.fromisoformat(chunk.created_at) <= datetime.now(UTC)


def large_history(pairs: int) -> EffectiveHistory:
    """Tool calls with long outputs (paths, hosts, words): a history whose compaction takes a lot of CPU."""
    chat = Chat(1, COUNTER)
    line = "GET /srv/app/handlers/user_{i}.py host-{i}.internal:8080 took {i} ms ok status fine\n"
    for i in range(pairs):
        chat.add({"role": "user", "content": f"look at file {i} please"})
        chat.add(call(f"c{i}"))
        chat.add({**result(f"c{i}"), "content": "".join(line.format(i=i * 40 + j) for j in range(40))})
        chat.add({"role": "assistant", "content": f"file {i} looks fine"})
    return EffectiveHistory(chunks=(), entries=tuple(chat.entries))


class LoopWatchingCounter(WordCounter):
    """A WordCounter that, the first time it counts off the event loop's thread, waits there
    until the loop has gone round a few times: it can only go on if the loop runs meanwhile."""

    TICKS = 5

    def __init__(self) -> None:
        self.loop_thread = threading.get_ident()
        self.ticks_while_waiting = 0
        self.waiting = threading.Event()
        self.resume = threading.Event()
        self.waited: list[bool] = []
        """Whether the loop went round while the compaction's thread waited (one entry: it waited once)."""

    def text(self, text: str) -> int:
        self._wait_for_the_loop()
        return super().text(text)

    def message(self, message: Mapping[str, Any]) -> int:
        self._wait_for_the_loop()
        return super().message(message)

    def _wait_for_the_loop(self) -> None:
        if threading.get_ident() != self.loop_thread and not self.waiting.is_set():
            self.waiting.set()
            # Only a failing run waits out the timeout: a loop that is blocked never ticks.
            self.waited.append(self.resume.wait(timeout=30))

    async def tick(self) -> None:
        """Go round the loop until stopped; while the compaction's thread waits, count and then free it."""
        while True:
            await asyncio.sleep(0.001)
            if self.waiting.is_set():
                self.ticks_while_waiting += 1
                if self.ticks_while_waiting >= self.TICKS:
                    self.resume.set()


class TestEventLoop:
    async def test_the_loop_keeps_running_during_a_large_compaction(self) -> None:
        """A compaction's CPU runs off the event loop: its token counting, on another thread,
        waits for the loop to go round, and the loop does (with the counting on the loop, the
        counter never leaves it, or the loop stands still while it waits)."""
        counter = LoopWatchingCounter()
        ticker = asyncio.create_task(counter.tick())
        try:
            out = await compact(
                large_history(100),
                limits(20_000, window=1_000_000, chunk_budget=5_000),
                [FakeSummarizer()],
                counter,
            )
        finally:
            ticker.cancel()
        assert out.outcome is Outcome.COMPACTED
        assert counter.waited == [True], "no counting off the loop, or the loop did not run meanwhile"
        assert counter.ticks_while_waiting >= LoopWatchingCounter.TICKS
