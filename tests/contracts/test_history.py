"""The effective history's data and its rendering: placements, the tag, system hoisting, JSON."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_worker.contracts.history import (
    SUMMARY_ACK,
    SUMMARY_HEADER,
    SYNTHETIC,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    SummaryPlacement,
    is_summary_text,
    render,
    summary_message_text,
)
from compaction_worker.strategies import provider_problems

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
PLACEMENTS: tuple[SummaryPlacement, ...] = ("separate", "merge")


def chunk(first_n: int = 1, last_n: int = 2, **kw: Any) -> SummaryChunk:
    defaults: dict[str, Any] = {
        "id": "c1",
        "text": "## Current state\n- the build is green",
        "first_seq": first_n,
        "last_seq": last_n,
        "first_n": first_n,
        "last_n": last_n,
        "tokens": 9,
        "created_at": "2024-01-01T00:00:00+00:00",
        "model": "fake",
    }
    defaults.update(kw)
    return SummaryChunk(**defaults)


def entry(n: int, role: str, content: Any = None, **message: Any) -> Entry:
    return Entry(n=n, seq=n, message={"role": role, "content": content, **message}, tokens=5)


def history(*entries: Entry, chunks: tuple[SummaryChunk, ...] = (chunk(),), **kw: Any) -> EffectiveHistory:
    return EffectiveHistory(chunks=chunks, entries=entries, **kw)


class TestSeparatePlacement:
    def test_summary_turn_then_acknowledgment(self) -> None:
        """References 000 and 001: the summary is a tagged user turn (never a system message) followed by an assistant acknowledgment."""
        out = render(history(entry(3, "user", "next question"), entry(4, "assistant", "answer")))
        assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant"]
        assert out[0]["content"] == summary_message_text((chunk(),))
        assert out[0]["content"].startswith(SUMMARY_HEADER)
        assert out[1]["content"] == SUMMARY_ACK
        assert provider_problems(out) == []

    def test_no_acknowledgment_before_an_assistant_message(self) -> None:
        """Reference 000 (the acknowledgment keeps roles alternating): when the assistant speaks next anyway, an acknowledgment would make two assistant turns."""
        out = render(history(entry(3, "assistant", "where was I"), entry(4, "user", "go on")))
        assert [m["role"] for m in out] == ["user", "assistant", "user"]
        assert out[1]["content"] == "where was I"
        assert provider_problems(out) == []

    def test_summary_alone(self) -> None:
        """References 000 and 001 (an empty tail): a history that is all summary still alternates: summary, acknowledgment."""
        out = render(history())
        assert [m["role"] for m in out] == ["user", "assistant"]

    def test_every_chunk_in_one_message(self) -> None:
        """Reference 003 (several summary chunks per conversation): they share the one summary turn, oldest first."""
        chunks = (chunk(1, 2, id="a", text="first part"), chunk(3, 4, id="b", text="second part"))
        out = render(history(entry(5, "user", "hi"), chunks=chunks))
        text = out[0]["content"]
        assert text.index("first part") < text.index("second part")
        assert sum(m["content"] == text for m in out) == 1


class TestTranscriptOrder:
    """Issue 36: what is older than every chunk (the task) comes before the summary turn, where it
    was said, so that it stays in the prefix a provider's cache serves."""

    def test_the_task_before_the_summary(self) -> None:
        h = history(entry(1, "user", "the task"), entry(5, "user", "next"), entry(6, "assistant", "ok"),
                    chunks=(chunk(2, 4),))  # fmt: skip
        out = render(h)
        assert [m["content"] for m in out] == [
            "the task",
            summary_message_text(h.chunks),
            SUMMARY_ACK,
            "next",
            "ok",
        ]
        assert provider_problems(out) == []

    def test_merged_into_the_first_user_message_after_its_place(self) -> None:
        h = history(entry(1, "user", "the task"), entry(5, "user", "next"), chunks=(chunk(2, 4),))
        out = render(h, "merge")
        assert [m["content"] for m in out] == ["the task", f"{summary_message_text(h.chunks)}\n\nnext"]

    @pytest.mark.parametrize(
        "older",
        [
            (entry(1, "assistant", "I start"),),
            (
                entry(0, "user", "go"),
                entry(1, "assistant", None, tool_calls=[{"id": "a", "type": "function"}]),
            ),
        ],
        ids=["assistant first", "a call left open"],
    )
    def test_older_messages_that_cannot_lead_follow_the_summary(self, older: tuple[Entry, ...]) -> None:
        """A history may not start with the assistant's, nor leave a call unanswered before the summary."""
        h = history(*older, entry(5, "user", "next"), chunks=(chunk(2, 4),))
        assert is_summary_text(render(h)[0]["content"])


class TestMergePlacement:
    def test_prepended_to_string_content(self) -> None:
        """Reference 001: the summary is merged into the first kept user message; no acknowledgment."""
        h = history(entry(3, "user", "next question"), entry(4, "assistant", "answer"))
        out = render(h, "merge")
        assert [m["role"] for m in out] == ["user", "assistant"]
        assert out[0]["content"] == f"{summary_message_text(h.chunks)}\n\nnext question"
        assert provider_problems(out) == []

    def test_prepended_to_the_first_text_part(self) -> None:
        """With list content the first text part carries the summary; images stay where they were."""
        parts = [IMAGE, {"type": "text", "text": "what is in this picture?"}, IMAGE]
        h = history(entry(3, "user", parts))
        content = render(h, "merge")[0]["content"]
        assert content[0] == IMAGE
        assert content[2] == IMAGE
        assert content[1]["text"] == f"{summary_message_text(h.chunks)}\n\nwhat is in this picture?"

    @pytest.mark.parametrize(
        "first",
        [
            entry(3, "assistant", "I was saying"),
            entry(3, "user", [IMAGE]),
        ],
        ids=["assistant first", "user without text"],
    )
    def test_falls_back_to_separate(self, first: Entry) -> None:
        """Reference 001: without a user message with text to merge into, the summary gets its own turn."""
        h = history(first)
        assert render(h, "merge") == render(h, "separate")

    def test_entries_are_not_mutated(self) -> None:
        """Merging builds a new message; the stored entry keeps its text."""
        parts = [{"type": "text", "text": "hello"}]
        first = entry(3, "user", parts)
        render(history(first), "merge")
        assert first.message["content"] == [{"type": "text", "text": "hello"}]

    def test_empty_string_content(self) -> None:
        """An empty user text becomes just the summary, without a dangling separator."""
        h = history(entry(3, "user", ""))
        assert render(h, "merge")[0]["content"] == summary_message_text(h.chunks)


class TestTag:
    @pytest.mark.parametrize("placement", PLACEMENTS)
    def test_recognised_in_either_placement(self, placement: SummaryPlacement) -> None:
        """References 000 and 001: the summary keeps its tag so a later compaction or a human recognises it."""
        out = render(history(entry(3, "user", "next")), placement)
        assert is_summary_text(out[0]["content"])
        assert not is_summary_text("next")

    def test_no_chunks_no_summary(self) -> None:
        """Without chunks there is nothing to place, in either placement."""
        h = history(entry(1, "user", "hi"), chunks=())
        assert render(h, "merge") == render(h, "separate") == [{"role": "user", "content": "hi"}]


class TestSystemMessages:
    def test_hoisted_into_one_leading_message(self) -> None:
        """References 001 and 003 (the system prompt stays first, always sent): system prompt and system entries become one system message; none mid-history (docs/design.md, invariant 4)."""
        h = history(
            entry(3, "user", "hi"),
            entry(4, "system", "Be brief."),
            entry(5, "assistant", "ok"),
            system_prompt="You are helpful.",
        )
        for placement in PLACEMENTS:
            out = render(h, placement)
            assert out[0] == {"role": "system", "content": "You are helpful.\n\nBe brief."}
            assert [m["role"] for m in out[1:]].count("system") == 0
            assert provider_problems(out) == []

    def test_private_fields_are_stripped(self) -> None:
        """``pinned`` is ours; providers never see it."""
        out = render(history(entry(3, "user", "keep me", pinned=True), chunks=()))
        assert out == [{"role": "user", "content": "keep me"}]


class TestEntry:
    def test_json_round_trip(self) -> None:
        """Entries survive storage with their content parts, edit and ordinal."""
        e = Entry(
            n=7, seq=3, message={"role": "user", "content": [IMAGE, {"type": "text", "text": "é"}]}, tokens=12
        )
        assert Entry.from_json(e.to_json()) == e
        edited = Entry(
            n=8,
            seq=3,
            message={"role": "tool", "tool_call_id": "a", "content": "[cleared]"},
            tokens=4,
            edit="pruned",
        )
        assert Entry.from_json(edited.to_json()) == edited

    def test_synthetic(self) -> None:
        """Repair's made-up messages have ordinal 0 and the synthetic edit; transcript ones do not."""
        made_up = Entry(
            n=0, seq=3, message={"role": "user", "content": "[Continue.]"}, tokens=3, edit=SYNTHETIC
        )
        assert made_up.synthetic
        assert Entry.from_json(made_up.to_json()).synthetic
        assert not entry(1, "user", "hi").synthetic


class TestSummaryChunk:
    def test_json_round_trip(self) -> None:
        """Reference 003 (Decision 8, summary storage): chunks survive storage, tuples included."""
        c = chunk(2, 9, stages=("summarize", "fold"), level=1, artifacts=("src/app.py",), kept=(4, 5))
        assert SummaryChunk.from_json(c.to_json()) == c

    def test_old_records_without_new_fields(self) -> None:
        """A chunk stored before ``kept`` existed still loads."""
        raw = chunk().to_json().replace(',"kept":[]', "")
        assert '"kept"' not in raw
        assert SummaryChunk.from_json(raw).kept == ()

    def test_covers_its_span_except_kept(self) -> None:
        """Reference 004 (non-destructive history): a chunk covers its span, except pinned messages kept as entries."""
        c = chunk(2, 6, kept=(4,))
        assert [n for n in range(1, 8) if c.covers(n)] == [2, 3, 5, 6]

    def test_never_covers_a_synthetic_ordinal(self) -> None:
        """Ordinal 0 (repair's made-up messages) is no transcript message, whatever the span says."""
        assert not chunk(0, 3).covers(0)

    def test_render_text_has_span_and_ledger(self) -> None:
        """Reference 000 (the summary points to the originals): the model reads which turns a chunk stands for and the verbatim references."""
        text = chunk(1, 4, artifacts=("src/app.py",)).render_text()
        assert text.startswith("## Turns 1-4\n")
        assert "- src/app.py" in text
