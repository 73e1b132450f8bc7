"""LangChain round trips: tool calls, tool messages, images, metadata carried in ``native``."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from compaction_worker.formats import NATIVE, FormatError, langchain
from tests.formats.helpers import PNG, pairs, provider_view, stored

MESSAGES: list[BaseMessage] = [
    SystemMessage(content="You are a helpful assistant."),
    HumanMessage(
        content=[
            {"type": "text", "text": "Weather in SF and NYC? Also this image:"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
    ),
    AIMessage(
        content="",
        tool_calls=[
            {"name": "get_weather", "args": {"city": "SF"}, "id": "call_1", "type": "tool_call"},
            {"name": "get_weather", "args": {"city": "NYC"}, "id": "call_2", "type": "tool_call"},
        ],
        id="run-42",
        response_metadata={"model_name": "gpt-4o", "finish_reason": "tool_calls"},
        usage_metadata={"input_tokens": 20, "output_tokens": 10, "total_tokens": 30},
    ),
    ToolMessage(content="60F", tool_call_id="call_1"),
    ToolMessage(content="boom", tool_call_id="call_2", status="error", artifact={"trace": "x"}),
    AIMessage(content="SF is 60F; NYC failed."),
]


class TestLangChain:
    def test_round_trip_is_exact(self) -> None:
        assert langchain.from_openai(stored(langchain.to_openai(MESSAGES))) == MESSAGES

    def test_tool_calls_pair_and_metadata_stays_private(self) -> None:
        messages = stored(langchain.to_openai(MESSAGES))
        assert pairs(messages) == [("call_1", "call_1"), ("call_2", "call_2")]
        assert messages[2]["tool_calls"][1]["function"] == {
            "name": "get_weather",
            "arguments": '{"city": "NYC"}',
        }
        assert NATIVE in messages[2]
        assert NATIVE not in messages[0]
        assert "usage_metadata" not in str(provider_view(messages))

    def test_plain_chat_history_becomes_messages(self) -> None:
        back = langchain.from_openai(
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ]
        )
        assert isinstance(back[1], AIMessage)
        assert back[1].tool_calls == [{"name": "f", "args": {"a": 1}, "id": "c", "type": "tool_call"}]
        assert isinstance(back[2], ToolMessage)
        assert back[2].tool_call_id == "c"

    def test_without_langchain_core_it_says_what_to_install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The module imports without langchain-core; using it then names the package to install."""
        monkeypatch.setattr(langchain, "_MISSING", ImportError("No module named 'langchain_core'"))
        with pytest.raises(FormatError, match="pip install langchain-core"):
            langchain.to_openai(MESSAGES)
