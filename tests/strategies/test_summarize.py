"""The summary stage: additive chunks, folds, the summary cap, usage, pieces, logs and notes."""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import replace

import pytest

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, Entry
from compaction_worker.strategies.draft import Draft
from compaction_worker.strategies.pipeline import compact
from compaction_worker.summaries.contract import SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.summaries.prompts import transcript_costs
from compaction_worker.testing import Chat
from tests.strategies.summarizers import summarize

from .helpers import COUNTER, words
from .summarizers import FILLER, Limited, Scripted, artifact_chat, chat, ctx_with, head_of, old_chunk, sent


class TestAdditive:
    """Reference 003: additive summarization, each span summarized once."""

    async def test_a_span_becomes_a_chunk_after_the_chunks_kept(self) -> None:
        """Reference 003: a later compaction appends a chunk; the earlier one is kept as it was."""
        first = old_chunk(1, 1, 50)
        draft = chat(10, start=2).draft((first,))
        scripted = Scripted()
        out = await summarize(draft, ctx_with(), [scripted])
        assert out.report is not None
        assert out.stages == ("summarize",)
        kept, new = out.draft.chunks
        assert kept is first
        assert (new.first_n, new.last_n, new.level) == (2, 15, 0)
        assert [e.n for e in out.draft.entries] == list(range(16, 22))
        request = scripted.requests[0]
        assert request.previous_summaries == []
        assert [m["content"] for m in request.messages] == [e.message["content"] for e in draft.entries[:14]]

    async def test_each_span_is_summarized_once(self) -> None:
        """Reference 003: the second compaction sends only the new span, never the first again."""
        scripted = Scripted()
        ctx = ctx_with(chunk_budget=5_000)
        first = await summarize(chat(10).draft(), ctx, [scripted])
        assert first.report is not None
        grown = Draft(first.draft.chunks, (*first.draft.entries, *chat(10, start=21).entries))
        second = await summarize(grown, ctx, [scripted])
        assert second.report is not None
        assert second.draft.chunks[0] == first.draft.chunks[0]
        assert len(second.draft.chunks) == 2
        sent_first = {m["content"] for m in scripted.requests[0].messages}
        sent_second = {m["content"] for m in scripted.requests[1].messages}
        assert sent_first.isdisjoint(sent_second)
        assert second.draft.chunks[1].first_n == first.draft.chunks[0].last_n + 1


class TestFold:
    """Reference 003: recursive re-summarization when the chunks outgrow their budget."""

    async def test_chunks_at_their_budget_stay_additive(self) -> None:
        """Chunks plus the new chunk's reserve exactly at the budget: no fold."""
        chunks = (old_chunk(1, 1, 60), old_chunk(2, 2, 40))
        out = await summarize(chat(10, start=3).draft(chunks), ctx_with(), [Scripted()])
        assert out.report is not None
        assert out.draft.chunks[:2] == chunks
        assert out.stages == ("summarize",)

    async def test_chunks_over_their_budget_fold_into_one(self) -> None:
        """Reference 003: one token over, every chunk and the new span become one chunk, a level up."""
        chunks = (old_chunk(1, 1, 61, "first summary"), old_chunk(2, 2, 40, "second summary", level=1))
        scripted = Scripted()
        out = await summarize(chat(10, start=3).draft(chunks), ctx_with(), [scripted])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        assert (chunk.first_n, chunk.last_n, chunk.level) == (1, 16, 2)
        assert out.stages == ("summarize", "fold")
        assert scripted.requests[0].previous_summaries == ["first summary", "second summary"]
        assert (
            out.report.tokens_saved
            == sum(c.tokens for c in chunks)
            + sum(e.tokens for e in chat(10, start=3).entries[:14])
            - chunk.tokens
        )


class TestSummaryCap:
    """The summary is capped so that heading, summary and ledger together fit the room."""

    async def test_cap_leaves_room_for_the_ledger(self) -> None:
        """With a tight target the cap shrinks by exactly the ledger's rendered cost."""
        target = 700
        plain = Scripted()
        with_artifacts = Scripted()
        filler_texts = ("plain request " + FILLER, "plain reply " + FILLER, "more " + FILLER)
        await summarize(artifact_chat(texts=filler_texts).draft(), ctx_with(target=target), [plain])
        out = await summarize(artifact_chat().draft(), ctx_with(target=target), [with_artifacts])
        assert out.report is not None
        chunk = out.draft.chunks[0]
        ledger_cost = COUNTER.text(chunk.render_text()) - COUNTER.text(
            replace(chunk, artifacts=()).render_text()
        )
        assert ledger_cost > 0
        cap_plain = plain.requests[0].max_summary_tokens
        cap_ledger = with_artifacts.requests[0].max_summary_tokens
        assert cap_plain < 500  # bound by the room, not by max_summary_tokens
        assert cap_plain - cap_ledger == ledger_cost

    async def test_summary_that_fills_its_cap_still_fits(self) -> None:
        """A summary exactly at its cap, plus heading and ledger, leaves the draft under the target."""
        ctx = ctx_with(target=800)
        out = await summarize(artifact_chat().draft(), ctx, [Scripted(words=None)])
        assert out.report is not None
        assert out.draft.chunks[0].artifacts
        assert ctx.tokens(out.draft) == ctx.limits.target

    async def test_what_it_replaces_bounds_the_summary_minus_the_ledger(self) -> None:
        """The summary must leave the whole chunk smaller than what it replaces."""
        scripted = Scripted()
        out = await summarize(artifact_chat().draft(), ctx_with(), [scripted])
        assert out.report is not None
        chunk = out.draft.chunks[0]
        frame = COUNTER.text(replace(chunk, text="").render_text())
        replaced = sum(e.tokens for e in artifact_chat().entries if chunk.covers(e.n))
        assert scripted.requests[0].replaced_tokens == replaced - frame


class TestUsage:
    """What the summarizer calls cost is reported, failed attempts included."""

    async def test_failed_attempts_are_added_to_the_winner(self) -> None:
        """A failed LLM's calls and the fallback's are summed, cost included."""
        failed = Scripted(
            name="llm", fail=True, usage=LlmUsage(calls=3, prompt_tokens=900, total_tokens=900, cost_usd=0.02)
        )
        fallback = Scripted(
            name="extractive", usage=LlmUsage(calls=1, prompt_tokens=10, completion_tokens=5, total_tokens=15)
        )
        out = await summarize(chat(10).draft(), ctx_with(), [failed, fallback])
        assert out.summarizer == "extractive"
        assert out.usage == LlmUsage(
            calls=4, prompt_tokens=910, completion_tokens=5, total_tokens=915, cost_usd=0.02
        )
        assert out.errors == ("llm: llm failed",)

    async def test_usage_is_reported_when_every_summarizer_fails(self) -> None:
        """No summary, but the calls were made: the compaction result still reports them."""
        failed = Scripted(fail=True, usage=LlmUsage(calls=2, prompt_tokens=40, total_tokens=40))
        history = EffectiveHistory((), chat(10).draft().entries)
        ctx = ctx_with(target=600)
        result = await compact(history, ctx.limits, [failed], COUNTER)
        assert result.outcome is Outcome.COMPACTED
        assert result.stages == ("truncate",)
        assert result.usage == LlmUsage(calls=2, prompt_tokens=40, total_tokens=40)


class TestPieces:
    """Issue 9: a span over the summarizer's input is read whole, in pieces that fit."""

    async def test_every_message_is_read_by_a_request_within_the_limit(self) -> None:
        """80 messages, a 600-token limit: consecutive additive chunks, each message sent exactly once."""
        draft = chat(40).draft()
        limited = Limited(600)
        out = await summarize(draft, ctx_with(target=3_000), [limited])
        assert out.report is not None
        chunks = out.draft.chunks
        assert len(chunks) == len(limited.requests) > 3
        assert all(sum(transcript_costs(r.messages, COUNTER.text)) <= 600 for r in limited.requests)
        assert sorted(sent(limited)) == sorted(head_of(draft, out))
        assert all(r.previous_summaries == [] for r in limited.requests)
        assert (chunks[0].first_n, chunks[0].level) == (1, 0)
        assert all(a.last_n + 1 == b.first_n for a, b in itertools.pairwise(chunks))
        assert chunks[-1].last_n + 1 == out.draft.entries[0].n
        assert (out.summarizer, out.tried, out.failures) == ("limited", 1, 0)
        assert f"summarized in {len(chunks)} pieces, each read whole" in out.notes[-1]
        assert ctx_with(target=3_000).fits(out.draft)

    async def test_tool_calls_and_results_stay_together(self) -> None:
        """A piece never ends between a call and its result (ids reused per turn, as runtimes do)."""
        c = Chat()
        for i in range(12):
            c.user(f"step {i} {FILLER}")
            c.tool("call_0", "read", {"path": f"f{i}.py"}, f"output {i} {FILLER}")
            c.assistant(f"read {i}")
        limited = Limited(300)
        out = await summarize(c.draft(), ctx_with(), [limited])
        assert out.report is not None
        assert len(limited.requests) > 2
        for request in limited.requests:
            roles = [m["role"] for m in request.messages]
            assert roles[0] != "tool"
            assert all(r != "tool" or roles[i - 1] == "assistant" for i, r in enumerate(roles))

    async def test_a_size_rejection_splits_further(self) -> None:
        """The summarizer claims 1,000 but refuses over 300 without saying so: halved until it fits."""
        draft = chat(30).draft()
        limited = Limited(1_000, refuses_over=300)
        out = await summarize(draft, ctx_with(), [limited])
        assert out.report is not None
        assert limited.refused
        assert all(sum(transcript_costs(r.messages, COUNTER.text)) <= 300 for r in limited.requests)
        assert sorted(sent(limited)) == sorted(head_of(draft, out))
        assert out.failures == 0

    async def test_a_learned_limit_is_used(self) -> None:
        """A rejection that says what fits: the next pieces are cut to it at once."""
        limited = Limited(1_000, refuses_over=250, told=250)
        out = await summarize(chat(30).draft(), ctx_with(), [limited])
        assert out.report is not None
        assert len(limited.refused) == 1

    async def test_one_message_too_large_goes_to_the_next_summarizer(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A single message no piece can hold: the next summarizer takes the rest, split for its own limit."""
        c = chat(4)
        c.user("paste " + words(400, "p"))
        for i in range(6):
            c.user(f"later {i} {FILLER}").assistant(f"fine {i} {FILLER}")
        draft = c.draft()
        limited, fallback = Limited(200), Scripted(name="fallback")
        caplog.set_level(logging.WARNING, logger="compaction_worker")
        out = await summarize(draft, ctx_with(target=2_500), [limited, fallback], conversation_id="conv-7")
        assert out.report is not None
        assert limited.refused
        assert len(fallback.requests) == 1
        assert fallback.requests[0].messages[0]["content"].startswith("paste ")
        assert sorted(sent(limited, fallback)) == sorted(head_of(draft, out))
        assert (out.summarizer, out.tried, out.failures) == ("limited, fallback", 2, 1)
        assert [c.model for c in out.draft.chunks][-1] == "fallback"
        (record,) = caplog.records
        assert "limited" in record.getMessage()
        assert "falling back to fallback" in record.getMessage()

    async def test_a_fold_goes_with_the_first_piece(self) -> None:
        """Chunks over their budget fold into the first piece's chunk; the later pieces are additive."""
        chunks = (old_chunk(1, 1, 61, "first summary"), old_chunk(2, 2, 40, "second summary", level=1))
        limited = Limited(600)
        out = await summarize(chat(30, start=3).draft(chunks), ctx_with(), [limited])
        assert out.report is not None
        first, *rest = out.draft.chunks
        assert (first.first_n, first.level, first.stages) == (1, 2, ("summarize", "fold"))
        assert rest
        assert all(c.level == 0 and c.stages == ("summarize",) for c in rest)
        assert limited.requests[0].previous_summaries == ["first summary", "second summary"]
        assert all(r.previous_summaries == [] for r in limited.requests[1:])
        assert out.stages == ("summarize", "fold")

    async def test_pieces_share_the_space_and_fit_together(self) -> None:
        """Summaries that fill their caps: all the chunks together still fit under the target."""
        ctx = ctx_with(target=3_000)
        out = await summarize(chat(40).draft(), ctx, [Limited(600, words=None)])
        assert out.report is not None
        assert len(out.draft.chunks) > 3
        assert ctx.fits(out.draft)


class TestChainedPieces:
    """Issue 33: pieces whose share of the room is too small for a summary are chained, not starved."""

    async def test_a_small_share_chains_the_pieces_into_one_chunk(self) -> None:
        """A 400-token limit at a 2,000 target: eight pieces, each request carrying the summary so far and
        given the whole room, every message read once, one chunk that fits."""
        draft = chat(30).draft()
        limited = Limited(400)
        ctx = ctx_with()
        out = await summarize(draft, ctx, [limited])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        first, *rest = limited.requests
        assert len(rest) > 3
        assert first.previous_summaries == []
        assert all(len(r.previous_summaries) == 1 for r in rest)
        assert chunk.text == " ".join(f"s{i}" for i in range(20))  # the last request's summary
        assert {r.max_summary_tokens for r in limited.requests} == {ctx.limits.max_summary_tokens}
        assert sorted(sent(limited)) == sorted(head_of(draft, out))
        assert (chunk.first_n, chunk.level, chunk.stages) == (1, 0, ("summarize",))
        assert chunk.last_n + 1 == out.draft.entries[0].n
        assert "each request carrying the summary so far" in out.notes[-1]
        assert ctx.fits(out.draft)

    async def test_a_chain_that_starts_with_a_fold_stays_a_fold(self) -> None:
        """The first piece folds the earlier chunks; the pieces after it carry that fold on."""
        chunks = (old_chunk(1, 1, 61, "first summary"), old_chunk(2, 2, 40, "second summary", level=1))
        limited = Limited(300)
        out = await summarize(chat(30, start=3).draft(chunks), ctx_with(), [limited])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        assert limited.requests[0].previous_summaries == ["first summary", "second summary"]
        assert (chunk.first_n, chunk.level, chunk.stages) == (1, 2, ("summarize", "fold"))
        assert out.stages == ("summarize", "fold")

    async def test_a_fallback_mid_chain_carries_what_the_model_wrote(self) -> None:
        """The model fails at the third piece: the fallback goes on from there with the summary so far,
        and both are named as writers."""

        class FailsThird(Limited):
            async def summarize(self, request: SummaryRequest) -> SummaryResult:
                if len(self.requests) == 2:
                    self.requests.append(request)
                    raise SummarizerError("cut off")
                return await super().summarize(request)

        draft = chat(30).draft()
        model, fallback = FailsThird(400), Scripted(name="fallback")
        out = await summarize(draft, ctx_with(), [model, fallback])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        (request,) = fallback.requests
        assert request.previous_summaries == [" ".join(f"s{i}" for i in range(20))]
        assert (out.summarizer, out.failures) == ("limited, fallback", 1)
        assert chunk.model == "fallback"
        read = [str(m["content"]) for r in model.requests[:2] for m in r.messages] + sent(fallback)
        assert sorted(read) == sorted(head_of(draft, out))


class TestFailureLogs:
    """Issue 9: a failed summary logs its reason at WARNING (the run binds the conversation id: test_compactor)."""

    async def test_a_failed_summarizer_is_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        """The LLM's failure and the fallback taking over are one warning, with the reason."""
        caplog.set_level(logging.WARNING, logger="compaction_worker")
        out = await summarize(
            chat(10).draft(), ctx_with(), [Scripted(name="llm", fail=True), Scripted()], conversation_id="c-1"
        )
        assert out.report is not None
        (record,) = caplog.records
        assert record.levelno == logging.WARNING
        assert record.getMessage() == "summary by llm failed (llm failed); falling back to scripted"


class TestNotes:
    """Board item 3: what the completion event should say reaches CompactionResult.notes."""

    async def test_notes_of_pieces_and_of_the_tail(self) -> None:
        """A latest turn over the tail bound, and a span in pieces: both are noted."""
        c = chat(20)
        c.user("now read everything")
        for i in range(12):
            c.tool(f"call_{i}", "read", {"path": f"f{i}.py"}, f"output {i} {FILLER} {FILLER}")
        history = EffectiveHistory((), c.draft().entries)
        ctx = ctx_with(target=2_500)
        result = await compact(history, ctx.limits, [Limited(400)], COUNTER)
        assert result.outcome is Outcome.COMPACTED
        assert any("the latest turn alone" in n for n in result.notes)
        assert any("pieces" in n for n in result.notes)


class TestKeptAheadOfTheChunks:
    async def test_a_task_kept_before_the_chunks_is_not_summarized_into_an_added_chunk(self) -> None:
        """Kept while the settings kept it, then no longer: it stays until a fold, never covered twice."""
        task = Entry(n=1, seq=1, message={"role": "user", "content": "the task"}, tokens=3)
        chat = Chat(start=10)
        for i in range(8):
            chat.user(f"filler {i} {FILLER}").assistant(f"reply {i} {FILLER}")
        draft = Draft((old_chunk(2, 9, 30),), (task, *chat.entries))
        out = await summarize(draft, ctx_with(task_max_tokens=0), [Scripted()])
        assert out.report is not None
        old, added = out.draft.chunks
        assert old.id == "c2"
        assert added.first_n >= 10
        assert out.draft.entries[0] is task


class TestTheNewestStep:
    """Issue 33: the newest step stays verbatim, cut if it must be, never summarized."""

    async def test_a_step_over_the_tails_bound_is_cut_to_fit_not_summarized(self) -> None:
        c = chat(10)
        c.tool("call_9", "write_file", {"path": "src/a.py", "content": words(3_000)}, words(3_000))
        draft = c.draft()
        ctx = ctx_with()
        out = await summarize(draft, ctx, [Scripted()])
        assert out.report is not None
        call, result = out.draft.entries[-2:]
        assert (call.n, result.n) == (draft.entries[-2].n, draft.entries[-1].n)
        arguments = json.loads(call.message["tool_calls"][0]["function"]["arguments"])
        assert arguments["path"] == "src/a.py"  # the arguments are cut, and still valid JSON
        assert "omitted" in arguments["content"]
        assert len(arguments["content"]) < len(words(3_000))
        assert result.edit == "truncated"
        assert ctx.tokens(out.draft) <= ctx.limits.target
        assert any("newest step" in note for note in out.notes)

    async def test_the_task_is_cut_from_what_the_user_wrote_each_time(self) -> None:
        """An earlier compaction's cut is not the next one's starting point: with room, the task is whole again."""
        c = Chat()
        c.user("Fix the totals: " + words(300))
        for i in range(6):
            c.assistant(f"a{i} {FILLER}").user(f"u{i} {FILLER}")
        c.assistant("done")
        task = c.entries[0]
        cut = Entry(
            n=task.n,
            seq=task.seq,
            message={"role": "user", "content": "Fix the totals: [cut]"},
            tokens=6,
            edit="truncated",
        )
        draft = Draft((), (cut, *c.entries[1:]))
        ctx = ctx_with(task_max_tokens=1_000, target=3_000)
        ctx = replace(ctx, originals={task.n: task.message})
        out = await summarize(draft, ctx, [Scripted()])
        assert out.report is not None
        kept = next(e for e in out.draft.entries if e.n == task.n)
        assert kept.message == task.message


async def test_chunks_that_would_leave_the_summary_too_little_room_are_folded_into_it() -> None:
    """Under their fold budget the chunks stay; when what must stay leaves the new summary less than
    half its reserve beside them, they are folded in rather than the run aiming over its target."""
    earlier = old_chunk(1, 1, 90, "earlier summary")
    c = Chat(start=2)
    c.add({"role": "user", "content": "keep " + words(1_450), "pinned": True})
    for i in range(8):
        c.assistant(f"a{i} {FILLER}").user(f"u{i} {FILLER}")
    c.assistant("done")
    scripted = Scripted()
    out = await summarize(c.draft((earlier,)), ctx_with(), [scripted])
    assert out.report is not None
    assert out.stages == ("summarize", "fold")
    assert scripted.requests[0].previous_summaries == ["earlier summary"]
    assert any("folded into this one to make room" in note for note in out.notes)
