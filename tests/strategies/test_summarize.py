"""The summary stage: additive chunks, folds, the artifact ledger, the summary cap and usage."""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from typing import Any

import pytest

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, SummaryChunk, public_message
from compaction_worker.errors import SummarizerError
from compaction_worker.strategies.draft import Draft, StageContext
from compaction_worker.strategies.ledger import merge_ledgers
from compaction_worker.strategies.pipeline import compact
from compaction_worker.strategies.summarize import summarize
from compaction_worker.summaries.artifacts import extract_artifacts
from compaction_worker.summaries.llm import InputTooLargeError, SummaryRequest, SummaryResult
from compaction_worker.summaries.prompts import transcript_costs

from .helpers import COUNTER, Chat, context, words

FILLER = words(50)


class Scripted:
    """A summarizer that answers with ``words`` words (or its whole cap), or fails with a usage."""

    def __init__(
        self,
        words: int | None = 20,
        *,
        name: str = "scripted",
        usage: LlmUsage | None = None,
        fail: bool = False,
    ) -> None:
        self.words, self.name, self.fail = words, name, fail
        self.usage = usage or LlmUsage()
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        if self.fail:
            raise SummarizerError(f"{self.name} failed", usage=self.usage)
        size = request.max_summary_tokens if self.words is None else self.words
        text = " ".join(f"s{i}" for i in range(size))
        return SummaryResult(text, self.name, COUNTER.text(text), self.usage)


class Fixed:
    """A summarizer that always answers with the same text."""

    name = "fixed"

    def __init__(self, text: str) -> None:
        self.text = text

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(self.text, self.name, COUNTER.text(self.text), LlmUsage())


def chat(turns: int, start: int = 1, say: str = FILLER) -> Chat:
    """``turns`` user/assistant pairs of about 55 tokens each."""
    c = Chat(start=start)
    for i in range(turns):
        c.user(f"u{start + 2 * i} {say}").assistant(f"a{start + 2 * i} {say}")
    return c


def old_chunk(first: int, last: int, tokens: int, text: str = "earlier", **kw: Any) -> SummaryChunk:
    """A stored chunk standing for messages ``first..last``."""
    return SummaryChunk(
        id=f"c{first}",
        text=text,
        first_seq=first,
        last_seq=last,
        first_n=first,
        last_n=last,
        tokens=tokens,
        created_at="2024-01-01T00:00:00+00:00",
        model="fake",
        **kw,
    )


def ctx_with(**limits: Any) -> StageContext:
    """The helpers' context over a 4,000-token window, with some limits overridden.

    Target 2,000; the reserve for a new summary is min(500, 0.3 * 2,000) = 500 and for its
    ledger min(400, 500) = 400, so chunks fold once they exceed 1,000 - 900 = 100 tokens.
    """
    ctx = context(window=4_000, target=2_000)
    return replace(ctx, limits=replace(ctx.limits, **{"chunk_budget": 1_000, **limits}))


class TestAdditive:
    """Reference 003: additive summarization, each span summarized once."""

    async def test_a_span_becomes_a_chunk_after_the_chunks_kept(self) -> None:
        """Reference 003: a later compaction appends a chunk; the earlier one is kept as it was."""
        first = old_chunk(1, 1, 50)
        draft = chat(10, start=2).draft((first,))
        scripted = Scripted()
        out = await summarize(draft, ctx_with(), [scripted])
        assert out.draft is not None
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
        assert first.draft is not None
        grown = Draft(first.draft.chunks, (*first.draft.entries, *chat(10, start=21).entries))
        second = await summarize(grown, ctx, [scripted])
        assert second.draft is not None
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
        assert out.draft is not None
        assert out.draft.chunks[:2] == chunks
        assert out.stages == ("summarize",)

    async def test_chunks_over_their_budget_fold_into_one(self) -> None:
        """Reference 003: one token over, every chunk and the new span become one chunk, a level up."""
        chunks = (old_chunk(1, 1, 61, "first summary"), old_chunk(2, 2, 40, "second summary", level=1))
        scripted = Scripted()
        out = await summarize(chat(10, start=3).draft(chunks), ctx_with(), [scripted])
        assert out.draft is not None
        (chunk,) = out.draft.chunks
        assert (chunk.first_n, chunk.last_n, chunk.level) == (1, 16, 2)
        assert out.stages == ("summarize", "fold")
        assert scripted.requests[0].previous_summaries == ["first summary", "second summary"]
        assert out.report is not None
        assert (
            out.report.tokens_saved
            == sum(c.tokens for c in chunks)
            + sum(e.tokens for e in chat(10, start=3).entries[:14])
            - chunk.tokens
        )


ARTIFACTS = (
    "Run `pytest tests/test_orders.py -k total` please; the code is in src/orders/total.py.",
    "$ pytest tests/test_orders.py -k total\nValueError: order 4412 total is negative\n1 failed",
    "I pushed commit 3f9a2c1d7e and opened https://ci.example.com/builds/9001 for it.",
)


def artifact_chat(start: int = 1, texts: tuple[str, ...] = ARTIFACTS) -> Chat:
    """Turns that mention exact paths, commands, errors, ids and URLs, then filler turns."""
    c = Chat(start=start)
    for i, text in enumerate(texts):
        (c.user if i % 2 == 0 else c.assistant)(text)
    if len(texts) % 2:
        c.assistant("noted")
    for i in range(8):
        c.user(f"filler {i} {FILLER}").assistant(f"reply {i} {FILLER}")
    return c


class TestLedger:
    """The verbatim artifact ledger each chunk carries (issue: LLM summaries drop them)."""

    async def test_new_chunk_keeps_its_span_artifacts_verbatim(self) -> None:
        """The ledger is extract_artifacts of exactly the summarized span, and it is rendered."""
        draft = artifact_chat().draft()
        ctx = ctx_with()
        out = await summarize(draft, ctx, [Scripted()])
        assert out.draft is not None
        (chunk,) = out.draft.chunks
        head = [public_message(e.message) for e in draft.entries if chunk.covers(e.n)]
        assert chunk.artifacts == tuple(
            extract_artifacts(head, ctx.settings.artifact_budget_tokens, COUNTER.text)
        )
        assert "error: ValueError: order 4412 total is negative" in chunk.artifacts
        assert "cmd: pytest tests/test_orders.py -k total" in chunk.artifacts
        assert "path: src/orders/total.py" in chunk.artifacts
        assert "url: https://ci.example.com/builds/9001" in chunk.artifacts
        assert "id: 3f9a2c1d7e" in chunk.artifacts
        assert "- error: ValueError: order 4412 total is negative" in chunk.render_text()
        assert chunk.tokens == COUNTER.text(chunk.render_text())

    async def test_summary_and_ledger_read_the_originals_of_edited_entries(self) -> None:
        """A span whose tool output an earlier run cleared is summarized from the transcript's original."""
        original = "Traceback (most recent call last):\nKeyError: 'order_id'\nsee src/orders/total.py"
        chat = Chat().user("run the tests").tool("r", "run_command", {"command": "make test"}, original)
        cleared = "[Old tool result cleared: run_command, 40 tokens; the full output is preserved in the transcript]"
        chat.entries[-1] = replace(
            chat.entries[-1], message={**chat.entries[-1].message, "content": cleared}, edit="pruned"
        )
        for i in range(8):
            chat.user(f"filler {i} {FILLER}").assistant(f"reply {i} {FILLER}")
        pruned_n = chat.entries[2].n
        summarizer = Scripted()
        without = await summarize(chat.draft(), ctx_with(), [Scripted()])
        out = await summarize(
            chat.draft(),
            ctx_with(),
            [summarizer],
            originals={pruned_n: {**chat.entries[2].message, "content": original}},
        )
        assert without.draft is not None
        assert out.draft is not None
        assert "error: KeyError: 'order_id'" not in without.draft.chunks[0].artifacts
        assert "error: KeyError: 'order_id'" in out.draft.chunks[0].artifacts
        assert "path: src/orders/total.py" in out.draft.chunks[0].artifacts
        (request,) = summarizer.requests
        assert original in [m.get("content") for m in request.messages]

    async def test_ledger_budget_scales_with_the_window(self) -> None:
        """artifact_budget_fraction of the window, above the floor: a large window keeps every path."""
        paths = " ".join(f"src/pkg/module_{i}.py" for i in range(200))
        draft = artifact_chat(texts=(f"Look at {paths}", "KeyError: 'order_id'", "fine")).draft()
        small, large = (
            replace(ctx_with(), settings=ctx_with().settings.model_copy(update=update))
            for update in (
                {"artifact_budget_tokens": 30, "artifact_budget_fraction": 0},
                {"artifact_budget_tokens": 30, "artifact_budget_fraction": 0.02},  # 80 of 4,000
            )
        )
        kept = []
        for ctx in (small, large):
            # A summary that fills its cap leaves the ledger nothing beyond its own budget.
            out = await summarize(draft, ctx, [Scripted(None)])
            assert out.draft is not None
            kept.append(out.draft.chunks[0].artifacts)
        sizes = [COUNTER.text("\n".join(ledger)) for ledger in kept]
        assert sizes[0] <= 30 < sizes[1] <= 80
        assert set(kept[0]) < set(kept[1])

    async def test_ledger_stays_within_its_budget_errors_first(self) -> None:
        """Many artifacts, a small budget: the ledger fits it and keeps the error over paths."""
        paths = " ".join(f"src/pkg/module_{i}.py" for i in range(200))
        texts = (f"Look at {paths}", "KeyError: 'order_id'", "fine")
        draft = artifact_chat(texts=texts).draft()
        ctx = replace(
            ctx_with(),
            settings=ctx_with().settings.model_copy(
                update={"artifact_budget_tokens": 30, "artifact_budget_fraction": 0}
            ),
        )
        out = await summarize(draft, ctx, [Scripted(None)])
        assert out.draft is not None
        ledger = out.draft.chunks[0].artifacts
        assert COUNTER.text("\n".join(ledger)) <= 30
        assert ledger[0] == "error: KeyError: 'order_id'"
        assert len(ledger) > 5

    async def test_fold_merges_the_ledgers(self) -> None:
        """A fold keeps the folded chunks' items and the new span's, each once, by kind."""
        older = old_chunk(1, 1, 80, artifacts=("error: ImportError: no module named yaml", "path: old/a.py"))
        newer = old_chunk(2, 2, 80, artifacts=("path: src/orders/total.py", "cmd: make lint"))
        out = await summarize(artifact_chat(start=3).draft((older, newer)), ctx_with(), [Scripted()])
        assert out.draft is not None
        (chunk,) = out.draft.chunks
        ledger = chunk.artifacts
        for item in (*older.artifacts, *newer.artifacts, "error: ValueError: order 4412 total is negative"):
            assert item in ledger
        assert len(ledger) == len(set(ledger))
        kinds = [item.split(":", 1)[0] for item in ledger]
        assert kinds == sorted(kinds, key=["error", "cmd", "path", "url", "id"].index)

    async def test_the_ledger_takes_what_a_short_summary_leaves(self) -> None:
        """Issue 9: ledger items outrank prose; a short summary's unused share goes to the ledger.

        The chunk never outgrows the one a summary filling its whole cap would make.
        """
        paths = " ".join(f"src/pkg/module_{i}.py" for i in range(200))
        draft = artifact_chat(texts=(f"Look at {paths}", "KeyError: 'order_id'", "fine")).draft()
        ctx = replace(
            ctx_with(),
            settings=ctx_with().settings.model_copy(
                update={"artifact_budget_tokens": 30, "artifact_budget_fraction": 0}
            ),
        )
        short = await summarize(draft, ctx, [Scripted(5)])
        full = await summarize(draft, ctx, [Scripted(None)])
        assert short.draft is not None
        assert full.draft is not None
        ledger = short.draft.chunks[0].artifacts
        assert COUNTER.text("\n".join(ledger)) > 3 * 30
        assert ledger[0] == "error: KeyError: 'order_id'"
        assert short.draft.chunks[0].tokens <= full.draft.chunks[0].tokens

    async def test_a_span_of_artifacts_still_shrinks(self) -> None:
        """When every word is an artifact, the ledger keeps at most half of what the chunk replaces."""
        texts = tuple(" ".join(f"svc-{t}-{i}" for i in range(60)) for t in range(6))
        draft = artifact_chat(texts=texts).draft()
        out = await summarize(draft, ctx_with(), [Scripted(5)])
        assert out.draft is not None
        (chunk,) = out.draft.chunks
        replaced = sum(e.tokens for e in draft.entries if chunk.covers(e.n))
        assert len(chunk.artifacts) > 30
        assert COUNTER.text("\n".join(chunk.artifacts)) <= replaced // 2

    async def test_items_the_summary_keeps_verbatim_take_no_room(self) -> None:
        """What the summary text already holds verbatim is not repeated in the ledger."""
        text = "Fixed src/orders/total.py after ValueError: order 4412 total is negative."
        out = await summarize(artifact_chat().draft(), ctx_with(), [Fixed(text)])
        assert out.draft is not None
        ledger = out.draft.chunks[0].artifacts
        assert not [item for item in ledger if "total.py" in item or "4412" in item]
        assert "url: https://ci.example.com/builds/9001" in ledger
        assert "id: 3f9a2c1d7e" in ledger

    async def test_a_fold_keeps_what_its_summary_drops(self) -> None:
        """Issue 9: the facts and ledger items of folded chunks survive a summary that drops them."""
        older = old_chunk(
            1,
            1,
            80,
            text="The user capped memory at 512 MiB; the freeze starts on 2025-03-14.",
            artifacts=("path: old/a.py", "name: acme-orders-archive"),
        )
        newer = old_chunk(2, 2, 80, text="Nothing else.", artifacts=("cmd: make lint",))
        out = await summarize(
            artifact_chat(start=3).draft((older, newer)), ctx_with(), [Fixed("Work went on.")]
        )
        assert out.draft is not None
        assert out.stages == ("summarize", "fold")
        (chunk,) = out.draft.chunks
        rendered = chunk.render_text()
        for kept in ("512 MiB", "2025-03-14", "old/a.py", "acme-orders-archive", "make lint", "4412"):
            assert kept in rendered

    def test_short_of_room_items_keep_their_cores_and_repeats_go(self) -> None:
        """Cores (the errno and address, the value) rather than sentences; contained items take no room."""
        error = "error: error: ECONNREFUSED 10.0.3.7:5012 while the payments service restarted after a deploy"
        items = [error, "host: 10.0.3.7:5012", "fact: set the memory limit to 512 MiB"]
        roomy = merge_ledgers([items], 1_000, COUNTER.text)
        assert roomy == (error, "fact: set the memory limit to 512 MiB")  # the host is in the error
        cores = "error: ECONNREFUSED 10.0.3.7:5012\nfact: 512 MiB"
        tight = merge_ledgers([items], COUNTER.text(cores) + 1, COUNTER.text)  # +1: a newline's estimate
        assert tight == ("error: ECONNREFUSED 10.0.3.7:5012", "fact: 512 MiB")

    def test_merge_prefers_recent_and_important_within_the_budget(self) -> None:
        """Rank is kind plus age: a recent error first, then a recent path over an old one."""
        newest = ["path: new.py", "error: E1: now"]
        oldest = ["path: old.py", "error: E0: before"]
        per_item = COUNTER.text("error: E1: now") + 1
        kept = merge_ledgers([newest, oldest], 3 * per_item, COUNTER.text)
        assert kept == ("error: E0: before", "error: E1: now", "path: new.py")
        assert merge_ledgers([newest, newest], 100, COUNTER.text) == ("error: E1: now", "path: new.py")
        assert merge_ledgers([newest], 0, COUNTER.text) == ()


class TestSummaryCap:
    """The summary is capped so that heading, summary and ledger together fit the room."""

    async def test_cap_leaves_room_for_the_ledger(self) -> None:
        """With a tight target the cap shrinks by exactly the ledger's rendered cost."""
        target = 800
        plain = Scripted()
        with_artifacts = Scripted()
        filler_texts = ("plain request " + FILLER, "plain reply " + FILLER, "more " + FILLER)
        await summarize(artifact_chat(texts=filler_texts).draft(), ctx_with(target=target), [plain])
        out = await summarize(artifact_chat().draft(), ctx_with(target=target), [with_artifacts])
        assert out.draft is not None
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
        assert out.draft is not None
        assert out.draft.chunks[0].artifacts
        assert ctx.tokens(out.draft) == ctx.limits.target

    async def test_what_it_replaces_bounds_the_summary_minus_the_ledger(self) -> None:
        """The summary must leave the whole chunk smaller than what it replaces."""
        scripted = Scripted()
        out = await summarize(artifact_chat().draft(), ctx_with(), [scripted])
        assert out.draft is not None
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


class Limited(Scripted):
    """A Scripted summarizer that declares a transcript limit and refuses what is over ``refuses_over``."""

    def __init__(
        self, limit: int | None, *, refuses_over: int | None = None, told: int | None = None, **kw: Any
    ):
        super().__init__(**{"name": "limited", **kw})
        self.limit, self.told = limit, told
        self.refuses_over = refuses_over if refuses_over is not None else limit
        self.refused: list[SummaryRequest] = []

    def transcript_limit(self, request: SummaryRequest) -> int | None:
        return self.limit

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        size = sum(transcript_costs(request.messages, COUNTER.text))
        if self.refuses_over is not None and size > self.refuses_over:
            self.refused.append(request)
            raise InputTooLargeError(f"{size} tokens over {self.refuses_over}", transcript_limit=self.told)
        return await super().summarize(request)


def sent(*summarizers: Scripted) -> list[str]:
    """Every message content the summarizers were asked to summarize (refused requests aside)."""
    return [str(m["content"]) for s in summarizers for r in s.requests for m in r.messages]


def head_of(draft: Draft, out: Any) -> list[str]:
    """What the outcome's new chunks cover: the contents of the summarized entries."""
    chunks = out.draft.chunks
    return [str(e.message["content"]) for e in draft.entries if any(c.covers(e.n) for c in chunks)]


class TestPieces:
    """Issue 9: a span over the summarizer's input is read whole, in pieces that fit."""

    async def test_every_message_is_read_by_a_request_within_the_limit(self) -> None:
        """60 messages, a 400-token limit: consecutive additive chunks, each message sent exactly once."""
        draft = chat(30).draft()
        limited = Limited(400)
        out = await summarize(draft, ctx_with(), [limited])
        assert out.draft is not None
        chunks = out.draft.chunks
        assert len(chunks) == len(limited.requests) > 3
        assert all(sum(transcript_costs(r.messages, COUNTER.text)) <= 400 for r in limited.requests)
        assert sorted(sent(limited)) == sorted(head_of(draft, out))
        assert (chunks[0].first_n, chunks[0].level) == (1, 0)
        assert all(a.last_n + 1 == b.first_n for a, b in itertools.pairwise(chunks))
        assert chunks[-1].last_n + 1 == out.draft.entries[0].n
        assert (out.summarizer, out.tried, out.failures) == ("limited", 1, 0)
        assert f"summarized in {len(chunks)} pieces" in out.notes[-1]
        assert ctx_with().fits(out.draft)

    async def test_tool_calls_and_results_stay_together(self) -> None:
        """A piece never ends between a call and its result (ids reused per turn, as runtimes do)."""
        c = Chat()
        for i in range(12):
            c.user(f"step {i} {FILLER}")
            c.tool("call_0", "read", {"path": f"f{i}.py"}, f"output {i} {FILLER}")
            c.assistant(f"read {i}")
        limited = Limited(300)
        out = await summarize(c.draft(), ctx_with(), [limited])
        assert out.draft is not None
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
        assert out.draft is not None
        assert limited.refused
        assert all(sum(transcript_costs(r.messages, COUNTER.text)) <= 300 for r in limited.requests)
        assert sorted(sent(limited)) == sorted(head_of(draft, out))
        assert out.failures == 0

    async def test_a_learned_limit_is_used(self) -> None:
        """A rejection that says what fits: the next pieces are cut to it at once."""
        limited = Limited(1_000, refuses_over=250, told=250)
        out = await summarize(chat(30).draft(), ctx_with(), [limited])
        assert out.draft is not None
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
        assert out.draft is not None
        assert limited.refused
        assert len(fallback.requests) == 1
        assert fallback.requests[0].messages[0]["content"].startswith("paste ")
        assert sorted(sent(limited, fallback)) == sorted(head_of(draft, out))
        assert (out.summarizer, out.tried, out.failures) == ("limited, fallback", 2, 1)
        assert [c.model for c in out.draft.chunks][-1] == "fallback"
        (record,) = caplog.records
        assert record.__dict__["conversation_id"] == "conv-7"
        assert "limited" in record.getMessage()
        assert "falling back to fallback" in record.getMessage()

    async def test_a_fold_goes_with_the_first_piece(self) -> None:
        """Chunks over their budget fold into the first piece's chunk; the later pieces are additive."""
        chunks = (old_chunk(1, 1, 61, "first summary"), old_chunk(2, 2, 40, "second summary", level=1))
        limited = Limited(600)
        out = await summarize(chat(30, start=3).draft(chunks), ctx_with(), [limited])
        assert out.draft is not None
        first, *rest = out.draft.chunks
        assert (first.first_n, first.level, first.stages) == (1, 2, ("summarize", "fold"))
        assert rest
        assert all(c.level == 0 and c.stages == ("summarize",) for c in rest)
        assert limited.requests[0].previous_summaries == ["first summary", "second summary"]
        assert all(r.previous_summaries == [] for r in limited.requests[1:])
        assert out.stages == ("summarize", "fold")

    async def test_pieces_share_the_space_and_fit_together(self) -> None:
        """Summaries that fill their caps: all the chunks together still fit under the target."""
        ctx = ctx_with(target=1_400)
        out = await summarize(chat(30).draft(), ctx, [Limited(300, words=None)])
        assert out.draft is not None
        assert len(out.draft.chunks) > 3
        assert ctx.fits(out.draft)


class TestFailureLogs:
    """Issue 9: a failed summary logs its reason at WARNING, with the conversation id."""

    async def test_a_failed_summarizer_is_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        """The LLM's failure and the fallback taking over are one warning, with the reason."""
        caplog.set_level(logging.WARNING, logger="compaction_worker")
        out = await summarize(
            chat(10).draft(), ctx_with(), [Scripted(name="llm", fail=True), Scripted()], conversation_id="c-1"
        )
        assert out.draft is not None
        (record,) = caplog.records
        assert record.levelno == logging.WARNING
        assert record.__dict__["conversation_id"] == "c-1"
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
