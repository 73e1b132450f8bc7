"""Summary items across compactions (summaries/schema.py in the summary stage): an additive chunk holds
what changed and the earlier chunks keep their bytes; a fold merges the items; the model's goals join
the standing state in its wording. Through LiteLLM's real request path against the fake server."""

from __future__ import annotations

from compaction_worker.strategies.draft import Draft
from compaction_worker.summaries.schema import Item
from compaction_worker.testing import FakeLLMServer
from tests.summaries.helpers import summarizer

from .summarizers import chat, ctx_with, summarize


class TestItemsAcrossCompactions:
    async def test_an_additive_chunk_leaves_the_items_before_it_as_they_were(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """The second compaction sends the first chunk's items with their ids and only the new span; the
        first chunk stays byte for byte, the new one holds its own items."""
        llm = summarizer(fake_llm)
        ctx = ctx_with(chunk_budget=5_000)
        first = await summarize(chat(10).draft(), ctx, [llm])
        (chunk,) = first.draft.chunks
        assert chunk.items
        assert chunk.text.startswith("## Goals and constraints\n- user: u1")
        grown = Draft(first.draft.chunks, (*first.draft.entries, *chat(10, start=21).entries))
        second = await summarize(grown, ctx, [llm])
        kept, new = second.draft.chunks
        assert kept.to_json() == chunk.to_json()
        listed = fake_llm.requests[-1]["messages"][1]["content"]
        assert Item.decode(chunk.items[0]).text in listed
        assert "u1 " not in listed.split("<transcript>")[1]  # the first span is not sent again
        assert new.items
        assert set(new.items).isdisjoint(chunk.items)

    async def test_a_fold_merges_the_items_and_keeps_the_unchanged_bytes(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """Folded, the chunks' items are one list: the earlier items as they were, then the new."""
        llm = summarizer(fake_llm)
        first = await summarize(chat(10).draft(), ctx_with(chunk_budget=5_000), [llm])
        grown = Draft(first.draft.chunks, (*first.draft.entries, *chat(10, start=21).entries))
        folded = await summarize(grown, ctx_with(chunk_budget=100), [llm])
        assert folded.stages == ("summarize", "fold")
        (chunk,) = folded.draft.chunks
        earlier = first.draft.chunks[0].items
        assert chunk.items[: len(earlier)] == earlier
        assert len(chunk.items) > len(earlier)

    async def test_the_models_goals_join_the_standing_state_in_its_wording(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """A goal item the cited turn supports becomes a standing item marked as the model's."""
        out = await summarize(chat(10).draft(), ctx_with(chunk_budget=5_000), [summarizer(fake_llm)])
        (goal,) = [i for i in out.items if i.model]
        assert goal.text.startswith("user: u1")
        assert (goal.seq, goal.kind) == (1, "goal")

    async def test_a_span_too_long_for_the_model_is_read_in_pieces_each_changing_the_items(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """A span over the model's input limit is read in pieces, each sent once: each request after the
        first lists the items so far with their ids, and each piece's reply adds items that cite turns of
        its own piece; no item is lost or repeated."""
        llm = summarizer(fake_llm, max_input_tokens=1_200)
        out = await summarize(chat(30).draft(), ctx_with(chunk_budget=5_000), [llm])
        assert out.report is not None
        bodies = [r["messages"][1]["content"] for r in fake_llm.requests]
        assert len(bodies) >= 3
        transcripts = [b.split("<transcript>")[1] for b in bodies]
        for i in range(1, 54, 2):  # every user turn in the replaced span, in exactly one piece
            assert sum(f"u{i} " in t for t in transcripts) == 1, i
        assert all("g1 [goals] user: u1" in body for body in bodies[1:])
        ids: list[str] = []
        for chunk in out.draft.chunks:
            items = [Item.decode(raw) for raw in chunk.items]
            assert items, chunk.text
            assert all(chunk.first_n <= turn <= chunk.last_n for item in items for turn in item.cites)
            ids += [item.id for item in items]
        assert len(ids) == len(set(ids))
