"""OpenAI chat, the stored form: validated in, private fields out, otherwise the identity."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_worker.contracts.history import PRIVATE_FIELDS
from compaction_worker.formats import NATIVE, FormatError, openai_chat
from tests.formats.helpers import PNG, pairs, stored

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this image, and the weather in Boston?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Boston"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "describe", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "22C"},
    {"role": "tool", "tool_call_id": "call_b", "content": "a red pixel"},
]


class TestOpenAIChat:
    def test_round_trip_is_the_identity(self) -> None:
        assert openai_chat.from_openai(openai_chat.to_openai(MESSAGES)) == MESSAGES
        assert pairs(stored(openai_chat.to_openai(MESSAGES))) == [("call_a", "call_a"), ("call_b", "call_b")]

    def test_rejects_an_invalid_message_by_index(self) -> None:
        with pytest.raises(FormatError, match="message 1"):
            openai_chat.to_openai([MESSAGES[0], {"role": "tool", "content": "no id"}])

    def test_private_fields_do_not_go_out(self) -> None:
        """``native`` is private, like ``pinned``: rendering strips it and tokens skip it."""
        assert NATIVE in PRIVATE_FIELDS
        assert openai_chat.from_openai([{**MESSAGES[0], "pinned": True, NATIVE: {}}]) == [MESSAGES[0]]
