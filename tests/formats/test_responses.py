"""Responses API round trips: messages with images, reasoning, parallel function calls and their outputs."""

from __future__ import annotations

from typing import Any

from compaction_worker.formats import NATIVE, responses
from tests.formats.helpers import PNG, pairs, provider_view, stored

ITEMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer with tools when you can."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Weather in Paris and Bogotá? And what is in this picture?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
            {"type": "input_file", "file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"},
        ],
    },
    {
        "type": "reasoning",
        "id": "rs_67ccf18f64008190a39b619f4c8455ef",
        "summary": [],
        "encrypted_content": "gAAAA",
    },
    {
        "type": "function_call",
        "id": "fc_12345xyz",
        "call_id": "call_12345xyz",
        "name": "get_weather",
        "arguments": '{"location":"Paris, France"}',
        "status": "completed",
    },
    {
        "type": "function_call",
        "id": "fc_67890abc",
        "call_id": "call_67890abc",
        "name": "get_weather",
        "arguments": '{"location":"Bogotá, Colombia"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_12345xyz", "output": "18°C"},
    {
        "type": "function_call_output",
        "call_id": "call_67890abc",
        "output": [{"type": "input_text", "text": "14°C"}],
    },
    {
        "type": "message",
        "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becbd2",
        "status": "completed",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": "Paris 18°C, Bogotá 14°C; a 1x1 pixel.", "annotations": []}
        ],
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
]


class TestResponses:
    def test_round_trip_is_exact(self) -> None:
        """Every item comes back in place, reasoning, statuses and unknown trailing items included."""
        assert responses.from_openai(stored(responses.to_openai(ITEMS))) == ITEMS

    def test_parallel_function_calls_are_one_assistant_message_each_answered(self) -> None:
        messages = stored(responses.to_openai(ITEMS))
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
        assert pairs(messages) == [("call_12345xyz", "call_12345xyz"), ("call_67890abc", "call_67890abc")]
        assert "rs_67ccf18f" in str(messages[2][NATIVE])

    def test_images_and_text_reach_the_provider_in_chat_shape(self) -> None:
        """The provider view is plain chat: text and image parts, no Responses-only item."""
        view = provider_view(responses.to_openai(ITEMS))
        assert view[1]["content"][1] == {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        }
        assert "reasoning" not in str(view)
        assert "input_file" not in str(view)
        assert view[4]["content"] == [{"type": "text", "text": "14°C"}]

    def test_plain_chat_history_becomes_items(self) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        assert responses.from_openai(messages) == [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": "checking"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]
