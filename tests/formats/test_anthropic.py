"""Anthropic Messages round trips: parallel tool use, tool results, images, thinking, unknown blocks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compaction_worker.formats import NATIVE, FormatError, anthropic
from tests.formats.helpers import PNG, pairs, provider_view, stored

SYSTEM = [{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral"}}]
CONVERSATION: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/map.jpg"}},
            {"type": "text", "text": "What's the weather in San Francisco and the time there?"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "Two independent lookups.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA",
            },
            {"type": "text", "text": "I'll check both at once."},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA", "unit": "celsius"},
            },
            {
                "type": "tool_use",
                "id": "toolu_01B09q90qw90lq917835lq9",
                "name": "get_time",
                "input": {"timezone": "America/Los_Angeles"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9", "content": "15 degrees"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01B09q90qw90lq917835lq9",
                "content": [{"type": "text", "text": "clock unavailable"}],
                "is_error": True,
            },
            {"type": "text", "text": "Also, is that warm?"},
        ],
    },
    {"role": "assistant", "content": "Mild: 15 °C is cool for summer."},
    {
        "role": "user",
        "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
            {"type": "text", "text": "Summarize my notes."},
        ],
    },
]


class TestAnthropic:
    def test_round_trip_is_exact(self) -> None:
        """Converted, stored (validated, through JSON) and converted back, the payload is unchanged."""
        original = copy.deepcopy(CONVERSATION)
        back = anthropic.from_openai(stored(anthropic.to_openai(original, system=SYSTEM)))
        assert back == anthropic.AnthropicMessages(SYSTEM, CONVERSATION)
        assert original == CONVERSATION  # the input is not mutated

    def test_parallel_tool_use_becomes_parallel_tool_calls_each_answered(self) -> None:
        """Two tool_use blocks make one assistant message; the two results, two tool messages in order."""
        messages = stored(anthropic.to_openai(CONVERSATION, system=SYSTEM))
        assert [m["role"] for m in messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "user",
            "assistant",
            "user",
        ]
        assert [c["function"]["name"] for c in messages[2]["tool_calls"]] == ["get_weather", "get_time"]
        assert pairs(messages) == [
            ("toolu_01A09q90qw90lq917835lq9", "toolu_01A09q90qw90lq917835lq9"),
            ("toolu_01B09q90qw90lq917835lq9", "toolu_01B09q90qw90lq917835lq9"),
        ]

    def test_images_become_image_url_parts(self) -> None:
        """A base64 source becomes a data URL, a url source its URL."""
        user = anthropic.to_openai(CONVERSATION)[0]
        assert [p.get("image_url") for p in user["content"]][:2] == [
            {"url": f"data:image/png;base64,{PNG}"},
            {"url": "https://example.com/map.jpg"},
        ]

    def test_what_chat_cannot_hold_stays_private(self) -> None:
        """Thinking, is_error and unknown blocks are in ``native`` only: the provider view has none of them."""
        messages = anthropic.to_openai(CONVERSATION)
        assert "thinking" in str(messages[1][NATIVE])
        assert "document" in str(messages[-1][NATIVE])
        assert "thinking" not in str(provider_view(messages))
        assert "is_error" not in str(provider_view(messages))
        assert NATIVE not in messages[4]  # a plain text reply needs nothing kept

    def test_an_edited_message_is_mapped_from_its_new_content(self) -> None:
        """A stored message changed after conversion (a compaction's cut) is not overwritten by the kept one;
        its signed thinking still leads it, unchanged (the API wants it back in a tool loop)."""
        messages = stored(anthropic.to_openai(CONVERSATION))
        messages[1]["content"] = [{"type": "text", "text": "[cut]"}]
        back = anthropic.from_openai(messages).messages
        assert back[1]["content"][1] == {"type": "text", "text": "[cut]"}
        assert back[1]["content"][0] == CONVERSATION[1]["content"][0]
        assert [b["type"] for b in back[1]["content"]] == ["thinking", "text", "tool_use", "tool_use"]

    def test_plain_openai_history_becomes_valid_anthropic(self) -> None:
        """Stored messages from another source: systems hoisted, tool results grouped after the calls."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "content": "2"},
            {"role": "assistant", "content": "done"},
        ]
        system, back = anthropic.from_openai(messages)
        assert system == "Be brief."
        assert back[1]["content"][1] == {
            "type": "tool_use",
            "id": "b",
            "name": "g",
            "input": {"arguments": "not json"},
        }
        assert back[2] == {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                {"type": "tool_result", "tool_use_id": "b", "content": "2"},
            ],
        }
        assert [m["role"] for m in back] == ["user", "assistant", "user", "assistant"]

    def test_rejects_a_role_anthropic_lacks(self) -> None:
        with pytest.raises(FormatError, match="message 0"):
            anthropic.to_openai([{"role": "system", "content": "x"}])
