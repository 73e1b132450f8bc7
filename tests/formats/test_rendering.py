"""The effective history rendered in a runtime's own format: reasoning kept, the summary plain."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from litellm.types.llms.anthropic import AllAnthropicMessageValues, AnthropicSystemMessageContent
from pydantic import TypeAdapter

from compaction_worker.contracts.history import (
    STANDING,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    render,
    summary_message_text,
)
from compaction_worker.formats import FormatError, anthropic, gemini, responses
from compaction_worker.formats.rendering import rendered
from tests.formats.helpers import stored
from tests.formats.provider_rules import anthropic_problems, responses_problems

THINKING = {"type": "thinking", "thinking": "Check the lockfile first.", "signature": "EqQBCgIYAhIM"}
LOOP: list[dict[str, Any]] = [
    {"role": "user", "content": "Why does CI fail?"},
    {
        "role": "assistant",
        "content": [
            THINKING,
            {"type": "text", "text": "Reading the lockfile."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "uv.lock"}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "version = 1"}],
    },
]
CHUNK = SummaryChunk("c1", "Earlier: set up the repo.", 1, 1, 1, 2, 10, "2026-11-25T00:00:00Z", "extractive")


def history(messages: list[dict[str, Any]], chunks: tuple[SummaryChunk, ...] = (CHUNK,)) -> EffectiveHistory:
    """``messages`` as the entries after a summary of two earlier transcript messages."""
    entries = [Entry(n=i + 3, seq=2, message=m, tokens=5) for i, m in enumerate(stored(messages))]
    return EffectiveHistory(chunks, tuple(entries))


MESSAGES_API = TypeAdapter(list[AllAnthropicMessageValues])
"""The Messages API's request shape for ``messages``, as LiteLLM types it."""
SYSTEM_BLOCKS = TypeAdapter(list[AnthropicSystemMessageContent])


def breakpoints(value: object) -> list[str]:
    """Where ``cache_control`` sits in a rendering (a path per breakpoint)."""
    found: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if "cache_control" in node:
                found.append(path)
            for key, child in node.items():
                walk(child, f"{path}.{key}")
        elif isinstance(node, list | tuple):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")

    walk(value, "")
    return found


class TestCacheBreakpoints:
    """Issue 36: Anthropic caches nothing unless told; ``cache=True`` marks the stable boundaries."""

    def test_after_the_system_prompt_the_summary_and_the_last_message(self) -> None:
        h = history([{"role": "system", "content": "Be terse."}, *anthropic.to_openai(LOOP)])
        system, messages = rendered(h, "anthropic", cache=True)

        assert system == [{"type": "text", "text": "Be terse.", "cache_control": anthropic.EPHEMERAL}]
        assert breakpoints(messages) == ["[0].content[0]", "[4].content[0]"]
        assert messages[0]["content"][0]["type"] == "text"  # the summary, as a text block
        SYSTEM_BLOCKS.validate_python(system, strict=True)
        MESSAGES_API.validate_python(messages)

    def test_the_summary_turn_is_one_block_per_chunk_and_the_breakpoint_follows_the_last_chunk(self) -> None:
        """A compaction that adds a chunk leaves the earlier chunks' blocks as they were: the cache
        serves them; the standing state after them changes at every compaction."""
        second = SummaryChunk(
            "c2", "Then: fixed the lockfile.", 3, 4, 2, 3, 10, "2026-11-25T00:01:00Z", "extractive"
        )
        state = Entry(
            n=0, seq=0, message={"role": "user", "content": "Standing: use uv."}, tokens=5, edit=STANDING
        )
        h = history(anthropic.to_openai(LOOP), chunks=(CHUNK, second))
        h = EffectiveHistory(h.chunks, (state, *h.entries))
        plain = rendered(h, "anthropic").messages[0]["content"]
        _, messages = rendered(h, "anthropic", cache=True)
        summary = messages[0]["content"]

        assert [b["text"] for b in summary] == [
            summary_message_text((CHUNK,)),
            second.render_text(),
            "Standing: use uv.",
        ]
        assert "\n\n".join(b["text"] for b in summary) == plain
        assert breakpoints(summary) == ["[1]"]
        earlier = rendered(history(anthropic.to_openai(LOOP)), "anthropic", cache=True).messages[0]["content"]
        assert earlier[0]["text"] == summary[0]["text"]  # the first chunk's block, unchanged
        MESSAGES_API.validate_python(messages)

    def test_the_breakpoint_follows_the_chunks_when_the_task_comes_first(self) -> None:
        """The task, older than the chunks, leads: with the summary turn it makes one user message
        (turns alternate), its own block first and unmarked, the breakpoint after the last chunk."""
        task = Entry(n=0, seq=1, message={"role": "user", "content": "Fix CI."}, tokens=5)
        h = history(anthropic.to_openai(LOOP))
        _, messages = rendered(EffectiveHistory(h.chunks, (task, *h.entries)), "anthropic", cache=True)

        first = messages[0]["content"]
        assert first[0] == {"type": "text", "text": "Fix CI."}
        assert first[1]["text"] == summary_message_text((CHUNK,))
        assert breakpoints(messages) == ["[0].content[1]", f"[{len(messages) - 1}].content[0]"]
        assert [m["role"] for m in messages][:2] == ["user", "assistant"]
        MESSAGES_API.validate_python(messages)

    def test_gemini_gets_the_task_and_the_summary_as_one_user_turn(self) -> None:
        """Gemini's roles alternate too: the task's part first, then the summary's."""
        task = Entry(n=0, seq=1, message={"role": "user", "content": "Fix CI."}, tokens=5)
        h = history(anthropic.to_openai(LOOP))
        contents = rendered(EffectiveHistory(h.chunks, (task, *h.entries)), "gemini").contents

        roles = [c["role"] for c in contents]
        assert all(a != b for a, b in itertools.pairwise(roles)), roles
        assert [p["text"] for p in contents[0]["parts"]] == ["Fix CI.", summary_message_text((CHUNK,))]

    def test_thinking_blocks_are_never_marked(self) -> None:
        """The API refuses ``cache_control`` on a thinking block: the last block that takes one is marked."""
        _, messages = rendered(history(anthropic.to_openai(LOOP[:2])), "anthropic", cache=True)
        assistant = messages[-1]["content"]

        assert breakpoints(assistant) == ["[2]"]
        assert assistant[0] == THINKING

    def test_without_a_summary_only_the_ends_are_marked_and_off_by_default_nothing_is(self) -> None:
        h = history([{"role": "system", "content": "Be terse."}, *anthropic.to_openai(LOOP)], chunks=())

        assert len(breakpoints(rendered(h, "anthropic", cache=True))) == 2
        assert breakpoints(rendered(h, "anthropic")) == []
        assert rendered(h, "openai", cache=True) == rendered(h, "openai")


class TestRendered:
    def test_openai_is_the_provider_view(self) -> None:
        """The default format is what :func:`render` gives: no private field."""
        h = history(anthropic.to_openai(LOOP))
        assert rendered(h) == render(h)
        assert "native" not in str(rendered(h))

    def test_anthropic_keeps_thinking_and_the_summary_is_plain(self) -> None:
        """Thinking comes back signed and first; the summary is a text user message without any."""
        system, messages = rendered(history(anthropic.to_openai(LOOP)), "anthropic")
        assert system is None
        assert messages[2:] == LOOP  # after the summary and its acknowledgment
        assert [m["role"] for m in messages[:2]] == ["user", "assistant"]
        assert all(isinstance(m["content"], str) for m in messages[:2])
        assert anthropic_problems(messages, LOOP) == []

    def test_anthropic_merge_placement(self) -> None:
        """Merged into the first user message, the summary leaves the assistant's thinking alone."""
        _, messages = rendered(history(anthropic.to_openai(LOOP)), "anthropic", "merge")
        assert messages[1:] == LOOP[1:]
        assert anthropic_problems(messages, LOOP) == []

    def test_an_edited_assistant_message_keeps_its_thinking(self) -> None:
        """A compaction that cut the visible text still sends the signed thinking back, first."""
        messages = anthropic.to_openai(LOOP)
        messages[1] = {**messages[1], "content": [{"type": "text", "text": "Reading [cut]"}]}
        _, out = rendered(history(messages), "anthropic")
        assert out[3]["content"][0] == THINKING
        assert out[3]["content"][1] == {"type": "text", "text": "Reading [cut]"}
        assert anthropic_problems(out, LOOP) == []

    def test_responses_keep_reasoning_items(self) -> None:
        items: list[dict[str, Any]] = [
            {"role": "user", "content": "Why does CI fail?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"},
            {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "version = 1"},
        ]
        out = rendered(history(responses.to_openai(items)), "responses")
        assert isinstance(out, list)
        assert out[-4:] == items
        assert responses_problems(out, items) == []

    def test_an_edited_responses_message_keeps_its_reasoning(self) -> None:
        items: list[dict[str, Any]] = [
            {"role": "user", "content": "Why?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "long"}]},
        ]
        messages = responses.to_openai(items)
        messages[1] = {**messages[1], "content": "[cut]"}
        out = rendered(history(messages), "responses")
        assert isinstance(out, list)
        assert out[-2] == items[1]
        assert out[-1]["content"] == "[cut]"
        assert responses_problems(out, items) == []

    def test_gemini_keeps_thought_signatures(self) -> None:
        contents: list[dict[str, Any]] = [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Look it up.", "thought": True},
                    {
                        "function_call": {"name": "get_weather", "args": {"city": "Paris"}},
                        "thought_signature": "CiQBcsjafQ0bDKqV",
                    },
                ],
            },
            {
                "role": "user",
                "parts": [{"function_response": {"name": "get_weather", "response": {"t": 18}}}],
            },
        ]
        out = rendered(history(gemini.to_openai(contents)), "gemini")
        assert out.contents[-3:] == contents
        assert out.system_instruction is None

    def test_chat_form_reasoning_fields_pass_through(self) -> None:
        """A LiteLLM chat message's ``thinking_blocks`` is the provider's field: the openai format keeps it."""
        message = {
            "role": "assistant",
            "content": "Done.",
            "thinking_blocks": [THINKING],
            "reasoning_content": "Check the lockfile first.",
        }
        out = rendered(history([{"role": "user", "content": "hi"}, message]))
        assert isinstance(out, list)
        assert out[-1] == message

    def test_unknown_format(self) -> None:
        with pytest.raises(FormatError, match="unknown format"):
            rendered(history([]), "bedrock")  # type: ignore[call-overload]  # the wrong name on purpose
