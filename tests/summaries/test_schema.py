"""The summary as checked items (summaries/schema.py), and the LiteLLM summarizer asking for it,
through LiteLLM's real request path against the fake server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compaction_worker.summaries import schema
from compaction_worker.summaries.contract import SummaryRequest
from compaction_worker.summaries.schema import Item, ReplyRefused
from compaction_worker.testing import FakeLLMServer
from compaction_worker.testing.replies import default_summary, schema_reply

from .helpers import count, request, summarizer

GOOD = schema_reply(
    {
        "goals": [("Add a /health endpoint to src/api/app.py", [1])],
        "errors": [("pytest -q tests/test_app.py failed: AssertionError: 404 != 200", [2, 3])],
        "next": [("Document it in docs/api.md", [5])],
    }
)


class TestParse:
    def test_a_fenced_reply_with_text_around_it(self) -> None:
        """A code fence and a remark after it are read past."""
        data = schema.parse(f"Here it is:\n```json\n{GOOD}\n```\nHope this helps!")
        assert data["goals"][0]["text"] == "Add a /health endpoint to src/api/app.py"

    def test_single_quotes_where_safe(self) -> None:
        """A reply in single quotes parses when no apostrophe could be one."""
        assert schema.parse("{'next': [{'text': 'run it', 'turns': [1]}]}") == {
            "next": [{"text": "run it", "turns": [1]}]
        }

    def test_a_cut_reply_keeps_its_complete_items(self) -> None:
        """A reply cut inside its third item keeps the two before it."""
        cut = GOOD[: GOOD.index("Document") + 4]
        data = schema.parse(cut, cut=True)
        assert [i["text"] for k in ("goals", "errors") for i in data[k]] == [
            "Add a /health endpoint to src/api/app.py",
            "pytest -q tests/test_app.py failed: AssertionError: 404 != 200",
        ]
        assert data.get("next", []) == []

    @pytest.mark.parametrize("reply", ["no json here", "{goals: [oops", "[1, 2]"])
    def test_what_does_not_parse_is_refused(self, reply: str) -> None:
        """No object, a broken one, an array: refused with the reason."""
        with pytest.raises(ReplyRefused):
            schema.parse(reply, cut=True)


class TestItems:
    def test_rendering_is_stable(self) -> None:
        """Sections in their fixed order whatever the items' order; the resolved last."""
        items = [
            Item("n1", "next", "run the tests"),
            Item("g1", "goals", "ship v2"),
            Item("s1", "state", "branch pushed", resolved=True),
        ]
        assert schema.render(items) == (
            "## Goals and constraints\n- ship v2\n## Next steps\n- run the tests\n## Resolved\n- branch pushed"
        )

    def test_an_item_keeps_its_bytes(self) -> None:
        """Decoding and encoding an item gives the same bytes."""
        raw = Item("a3", "artifacts", "src/x.py", (4, 7), replaces="a1").encode()
        assert Item.decode(raw).encode() == raw

    def test_merge_lets_later_chunks_win(self) -> None:
        """A later copy of an id replaces it; an item that replaces another removes it."""
        old = [Item("g1", "goals", "ship v1"), Item("n1", "next", "tag it")]
        new = [Item("g2", "goals", "ship v2", replaces="g1"), Item("n1", "next", "tag it", resolved=True)]
        assert schema.merge([old, new]) == [new[0], new[1]]

    def test_the_oldest_resolved_go_first(self) -> None:
        """Over budget, resolved items leave before any current one."""
        items = [
            Item("s1", "state", "alpha beta gamma", resolved=True),
            Item("g1", "goals", "keep this goal"),
            Item("s2", "state", "delta epsilon", resolved=True),
        ]
        kept, dropped = schema.fit(items, count(schema.render(items)) - 1, count)
        assert dropped == [items[0]]
        assert kept == items[1:]

    def test_an_identifier_not_in_the_cited_turns_is_unsupported(self) -> None:
        """Paths, names and numbers must be in the source; plain words need not be."""
        source = "edit /src/app.py line 42"
        assert schema.unsupported("Edited the file /src/app.py at line 42", source) == []
        assert schema.unsupported("Edited /src/other.py at line 43", source) == ["/src/other.py", "43"]


def _asked_json(body: dict[str, Any]) -> bool:
    return "Reply with one JSON object" in body["messages"][0]["content"]


class TestSummarizer:
    async def test_json_asked_in_the_prompt_where_no_schema_is_supported(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """The fake's model is unknown to LiteLLM: JSON is asked for in the prompt, no response_format;
        the fake answers against the schema and the summary renders its items."""
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        body = fake_llm.requests[0]
        assert _asked_json(body)
        assert "response_format" not in body
        assert result.items
        assert result.text == schema.render([Item.decode(raw) for raw in result.items])
        assert result.text.startswith("## Goals and constraints\n- user: Add a /health endpoint")

    async def test_response_format_where_set(self, fake_llm: FakeLLMServer) -> None:
        """``output=schema`` sends the JSON schema as response_format, with bounded counts and lengths."""
        result = await summarizer(fake_llm, output="schema").summarize(request(max_summary_tokens=350))
        sent = fake_llm.requests[0]["response_format"]
        assert sent["type"] == "json_schema"
        goals = sent["json_schema"]["schema"]["properties"]["goals"]
        assert goals["maxItems"] == schema.Limits.for_room(350).per_section == 4
        # A first summary always says where the span ends, its purpose and a fact (a small model under
        # a grammar that allows it answers every list empty); a later one, where the span ends.
        said = {
            key
            for key, section in sent["json_schema"]["schema"]["properties"].items()
            if section.get("minItems")
        }
        assert said == {"state", "goals", "facts"}
        anchored = schema.json_schema(schema.Limits.for_room(350), anchored=True)["properties"]
        assert {key for key, section in anchored.items() if section.get("minItems")} == {"state"}
        assert result.items

    async def test_grammar_sends_the_schema_in_the_json_object_shape(self, fake_llm: FakeLLMServer) -> None:
        """``output=grammar``: the same schema as ``{"type": "json_object", "schema": ...}``, the shape
        llama.cpp's server enforces as a grammar (it ignores OpenAI's json_schema shape), through LiteLLM."""
        result = await summarizer(fake_llm, output="grammar").summarize(request(max_summary_tokens=350))
        sent = fake_llm.requests[0]["response_format"]
        assert sent["type"] == "json_object"
        assert sent["schema"] == schema.json_schema(schema.Limits.for_room(350))
        assert result.items

    async def test_a_malformed_reply_is_refused_then_markdown_is_asked(self, fake_llm: FakeLLMServer) -> None:
        """A reply that does not parse is refused; the same model writes Markdown next."""
        replies = iter(['{"goals": [{"text": broken', None])
        fake_llm.set_responder(lambda body: next(replies) or default_summary(body))
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        first, second = fake_llm.requests
        assert _asked_json(first)
        assert not _asked_json(second)
        assert result.items == ()
        assert result.text.startswith("## Goals and constraints")

    async def test_a_cut_reply_keeps_the_items_it_completed(self, fake_llm: FakeLLMServer) -> None:
        """finish_reason=length: the complete items stay, one call, no shorter summary asked."""
        cut = GOOD[: GOOD.index("Document") + 4]
        fake_llm.set_responder(lambda body: {"content": cut, "finish_reason": "length"})
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        assert len(fake_llm.requests) == 1
        assert [Item.decode(raw).section for raw in result.items] == ["goals", "errors"]
        assert "docs/api.md" not in result.text

    async def test_an_off_span_reply_is_refused(self, fake_llm: FakeLLMServer) -> None:
        """An item citing a turn outside the span refuses the whole reply."""
        off = schema_reply({"goals": [("Add a /health endpoint", [1])], "state": [("done", [99])]})
        replies = iter([off, None])
        fake_llm.set_responder(lambda body: next(replies) or default_summary(body))
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        assert len(fake_llm.requests) == 2
        assert result.items == ()

    async def test_a_hallucinated_identifier_never_enters(self, fake_llm: FakeLLMServer) -> None:
        """An item whose path or number the cited turns do not hold is dropped and counted."""
        lying = schema_reply(
            {
                "goals": [("Add a /health endpoint to src/api/app.py", [1])],
                "artifacts": [("Wrote /etc/made-up/settings.py", [1]), ("Port 8443 opened", [3])],
            }
        )
        fake_llm.set_reply(lying)
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        assert result.refused == 2
        assert "made-up" not in result.text
        assert "8443" not in result.text
        assert "src/api/app.py" in result.text

    async def test_a_wrong_or_missing_cite_is_corrected_not_refused(self, fake_llm: FakeLLMServer) -> None:
        """A small model cites the wrong turn, or none: an item whose identifiers the span holds is kept,
        cited where they are said; one the span never says is still refused."""
        fake_llm.set_reply(
            schema_reply(
                {
                    "goals": [("Add a /health endpoint to src/api/app.py", [3])],
                    "artifacts": [("Wrote /etc/made-up/settings.py", [])],
                }
            )
        )
        result = await summarizer(fake_llm).summarize(request(max_summary_tokens=300))
        (kept,) = [Item.decode(raw) for raw in result.items]
        assert "src/api/app.py" in kept.text
        assert 1 in kept.cites
        assert result.refused == 1
        assert "made-up" not in result.text

    async def test_changes_to_the_current_items(self, fake_llm: FakeLLMServer) -> None:
        """A later summary sends the current items with ids and gets changes: unchanged items keep their
        bytes (a fold holds them all), a replaced one leaves, a resolved one is marked."""
        current = [
            Item("g1", "goals", "Add a /health endpoint", (3,)).encode(),
            Item("n1", "next", "Write the route", (4,)).encode(),
            Item("s1", "state", "Nothing started", (4,)).encode(),
        ]
        change = {
            "goals": [{"text": "Add /health to src/api/app.py", "turns": [1], "replaces": "g1"}],
            "resolved": ["n1"],
        }
        fake_llm.set_reply(json.dumps(change))
        folded = await summarizer(fake_llm).summarize(
            request(max_summary_tokens=300, items=current, folds=True, seqs=[10, 11, 12, 13, 14])
        )
        body = fake_llm.requests[0]
        assert "g1 [goals] Add a /health endpoint" in body["messages"][1]["content"]
        assert "Return only changes" in body["messages"][0]["content"]
        after = [Item.decode(raw) for raw in folded.items]
        assert folded.items[1] == current[2]  # unchanged: the same bytes
        assert [(i.id, i.resolved) for i in after] == [("n1", True), ("s1", False), ("g2", False)]
        assert after[2].cites == (10,)
        assert after[2].replaces == "g1"
        additive = await summarizer(fake_llm).summarize(
            request(max_summary_tokens=300, items=current, seqs=[10, 11, 12, 13, 14])
        )
        # An additive chunk holds only what changed; the others stay in their chunks.
        assert [Item.decode(raw).id for raw in additive.items] == ["n1", "g2"]
        assert (
            additive.text
            == "## Goals and constraints\n- Add /health to src/api/app.py\n## Resolved\n- Write the route"
        )

    async def test_a_fold_with_no_new_turn_merges_the_items_without_a_call(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """Nothing new to read: the items as they are, bytes and all, the oldest resolved let go first
        to fit; no request, no tokens spent."""
        current = [
            Item("g1", "goals", "Add a /health endpoint to src/api/app.py", (3,)).encode(),
            Item("n1", "next", "Write the route and its test", (4,), resolved=True).encode(),
            Item("s1", "state", "The route is written; pytest -q tests/test_app.py passes", (9,)).encode(),
        ]
        merged = await summarizer(fake_llm).summarize(
            SummaryRequest(
                "conv-1",
                [],
                previous_summaries=["a", "b"],
                itemized=[True, True],
                items=current,
                folds=True,
                max_summary_tokens=300,
                replaced_tokens=400,
            )
        )
        assert fake_llm.requests == []
        assert merged.usage.calls == 0
        assert merged.items == tuple(current)
        tight = await summarizer(fake_llm).summarize(
            SummaryRequest(
                "conv-1",
                [],
                previous_summaries=["a"],
                itemized=[True],
                items=current,
                folds=True,
                max_summary_tokens=300,
                replaced_tokens=30,
            )
        )
        assert fake_llm.requests == []
        assert current[1] not in tight.items  # the resolved one went first
        assert tight.let_go >= 1
        assert tight.tokens < 30

    async def test_a_fold_of_markdown_summaries_with_no_new_turn_asks_for_markdown(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """No turn to cite and no items: JSON could only be refused (a cite outside an empty span), so the
        model is asked for Markdown at once."""
        fake_llm.set_reply("## Current state\n- The /health route is written.")
        out = await summarizer(fake_llm, output="schema").summarize(
            SummaryRequest(
                "conv-1",
                [],
                previous_summaries=["## Current state\n- The /health route is written and tested."],
                folds=True,
                max_summary_tokens=300,
                replaced_tokens=400,
            )
        )
        (body,) = fake_llm.requests
        assert "response_format" not in body
        assert out.text.startswith("## Current state")
