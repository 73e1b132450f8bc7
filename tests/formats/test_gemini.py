"""Gemini round trips: system instruction, parallel function calls, images, thoughts with signatures."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from compaction_worker.formats import NATIVE, FormatError, GeminiContents, gemini
from compaction_worker.strategies import provider_problems
from tests.formats.helpers import PNG, pairs, provider_view, stored

SYSTEM: dict[str, Any] = {"parts": [{"text": "You are a weather bot."}]}
FILE = "https://generativelanguage.googleapis.com/v1beta/files/8ovsw6pbqbo7"
CONTENTS: list[dict[str, Any]] = [
    {
        "role": "user",
        "parts": [
            {"text": "Weather in Paris, the time in Tokyo, and what is on this map and in this report?"},
            {"inline_data": {"mime_type": "image/png", "data": PNG}},
            {"file_data": {"mime_type": "application/pdf", "file_uri": FILE}},
        ],
    },
    {
        "role": "model",
        "parts": [
            {"text": "Two independent lookups; call both.", "thought": True},
            {
                "function_call": {
                    "name": "get_weather",
                    "args": {"location": "Paris", "unitSystem": "metric"},
                },
                "thought_signature": "CiQBcsjafQ0bDKqVnD2iEJl3",
            },
            {"function_call": {"name": "get_time", "args": {"timezone": "Asia/Tokyo"}}},
        ],
    },
    {
        "role": "user",
        "parts": [  # answered out of order: paired by name, not by place
            {"function_response": {"name": "get_time", "response": {"time": "21:04"}}},
            {"function_response": {"name": "get_weather", "response": {"temperature": 18, "sky": "clair"}}},
            {"text": "Is that warm?"},
        ],
    },
    {
        "role": "model",
        "parts": [
            {"executable_code": {"language": "PYTHON", "code": "print(18 * 9 / 5 + 32)"}},
            {"code_execution_result": {"outcome": "OUTCOME_OK", "output": "64.4\n"}},
            {"text": "Mild: 18 °C is 64 °F.", "thought_signature": "EqQBCgIYAhIM1gbcDa9G"},
        ],
    },
    {"role": "user", "parts": [{"text": "Thanks."}]},
]


class TestGemini:
    def test_round_trip_is_exact(self) -> None:
        """Converted, stored (validated, through JSON) and converted back, the contents are unchanged."""
        original = copy.deepcopy(CONTENTS)
        back = gemini.from_openai(stored(gemini.to_openai(original, system_instruction=SYSTEM)))
        assert back == GeminiContents(SYSTEM, CONTENTS)
        assert original == CONTENTS  # the input is not mutated

    def test_parallel_function_calls_become_parallel_tool_calls_each_answered(self) -> None:
        """Two function_calls make one assistant message; responses pair with calls by name, in order."""
        messages = stored(gemini.to_openai(CONTENTS, SYSTEM))
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
        assert [c["function"] for c in messages[2]["tool_calls"]] == [
            {"name": "get_weather", "arguments": '{"location": "Paris", "unitSystem": "metric"}'},
            {"name": "get_time", "arguments": '{"timezone": "Asia/Tokyo"}'},
        ]
        assert pairs(messages) == [("call_1", "call_1"), ("call_0", "call_0")]
        assert messages[3]["content"] == '{"time": "21:04"}'
        assert messages[5]["content"] == "Is that warm?"

    def test_the_stored_form_is_a_valid_provider_history(self) -> None:
        assert provider_problems(provider_view(stored(gemini.to_openai(CONTENTS, SYSTEM)))) == []

    def test_images_and_files_become_image_url_parts(self) -> None:
        """inline_data becomes a data URL; file_data its URI, its mime type as LiteLLM's ``format``."""
        user = gemini.to_openai(CONTENTS)[0]
        assert user["content"][1:] == [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": FILE, "format": "application/pdf"}},
        ]

    def test_thoughts_signatures_and_unknown_parts_stay_private(self) -> None:
        """Thoughts, signatures and code execution parts are in ``native`` only: the provider view has none."""
        messages = gemini.to_openai(CONTENTS)
        assert "CiQBcsjafQ0bDKqVnD2iEJl3" in str(messages[1][NATIVE])
        assert "executable_code" in str(messages[5][NATIVE])
        view = str(provider_view(messages))
        for private in ("thought", "Two independent lookups", "CiQBcsjafQ", "print(18"):
            assert private not in view
        assert provider_view(messages)[5] == {"role": "assistant", "content": "Mild: 18 °C is 64 °F."}
        assert NATIVE not in messages[-1]  # a plain text turn needs nothing kept

    def test_system_prompts_go_to_system_instruction_never_to_contents(self) -> None:
        """Every system message, wherever it is, is hoisted: one part each, in order."""
        system, contents = gemini.from_openai(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
                {"role": "assistant", "content": "salut"},
            ]
        )
        assert system == {"parts": [{"text": "Be brief."}, {"text": "Answer in French."}]}
        assert contents == [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "salut"}]},
        ]
        assert gemini.from_openai(gemini.to_openai(CONTENTS)).system_instruction is None

    def test_the_system_instruction_is_the_first_stored_message(self) -> None:
        messages = gemini.to_openai(CONTENTS, "Be brief.")
        assert messages[0] == {"role": "system", "content": "Be brief."}
        assert [m["role"] for m in messages].count("system") == 1

    def test_camel_case_and_bytes_read_as_snake_case_and_base64(self) -> None:
        """A REST request body in camelCase, or SDK dicts with bytes, convert as the snake_case form does."""
        request = {
            "systemInstruction": {"parts": [{"text": "You are a weather bot."}]},
            "contents": [
                {
                    "role": "user",
                    "parts": [{"inlineData": {"mimeType": "image/png", "data": base64.b64decode(PNG)}}],
                },
                {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"name": "get_weather", "args": {"unitSystem": "metric"}},
                            "thoughtSignature": b"\x01\x02",
                        }
                    ],
                },
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"name": "get_weather", "response": {"tempC": 18}}}],
                },
            ],
            "generationConfig": {"temperature": 0},
        }
        snake = [
            {"role": "user", "parts": [{"inline_data": {"mime_type": "image/png", "data": PNG}}]},
            {
                "role": "model",
                "parts": [
                    {
                        "function_call": {"name": "get_weather", "args": {"unitSystem": "metric"}},
                        "thought_signature": "AQI=",
                    }
                ],
            },
            {
                "role": "user",
                "parts": [{"function_response": {"name": "get_weather", "response": {"tempC": 18}}}],
            },
        ]
        messages = gemini.to_openai(request)
        assert messages == gemini.to_openai(snake, SYSTEM)
        assert gemini.from_openai(stored(messages)) == GeminiContents(SYSTEM, snake)

    def test_plain_chat_history_becomes_valid_gemini(self) -> None:
        """Stored messages from another source: ids dropped, results regrouped with the user message after them."""
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": '{"y": 2}'},
            {"role": "tool", "tool_call_id": "b", "content": "plain text"},
            {"role": "user", "content": "and?"},
            {"role": "assistant", "content": "done"},
        ]
        system, contents = gemini.from_openai(messages)
        assert system is None
        assert contents[1] == {
            "role": "model",
            "parts": [
                {"function_call": {"name": "f", "args": {"x": 1}}},
                {"function_call": {"name": "g", "args": {"arguments": "not json"}}},
            ],
        }
        assert contents[2] == {
            "role": "user",
            "parts": [
                {"function_response": {"name": "f", "response": {"y": 2}}},
                {"function_response": {"name": "g", "response": {"output": "plain text"}}},
                {"text": "and?"},
            ],
        }
        assert [c["role"] for c in contents] == ["user", "model", "user", "model"]

    def test_turns_converted_one_at_a_time_pair_by_order(self) -> None:
        """Responses with no model turn before them take call_<n>: their calls' ids when in call order."""
        weather, time = CONTENTS[2]["parts"][1], CONTENTS[2]["parts"][0]
        messages = stored(gemini.to_openai(CONTENTS[:2]) + gemini.to_openai([{"parts": [weather, time]}]))
        assert pairs(messages) == [("call_0", "call_0"), ("call_1", "call_1")]
        assert [m["content"] for m in messages[2:]] == [
            '{"temperature": 18, "sky": "clair"}',
            '{"time": "21:04"}',
        ]

    def test_ids_gemini_gave_are_used_and_kept(self) -> None:
        contents = [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [{"function_call": {"id": "fc-7", "name": "f", "args": {}}}]},
            {"role": "user", "parts": [{"function_response": {"id": "fc-7", "name": "f", "response": {}}}]},
        ]
        messages = stored(gemini.to_openai(contents))
        assert pairs(messages) == [("fc-7", "fc-7")]
        assert gemini.from_openai(messages).contents == contents

    def test_text_before_responses_keeps_its_place(self) -> None:
        """Chat puts the results first; the turn still comes back in its own order."""
        contents = [
            CONTENTS[1],
            {
                "role": "user",
                "parts": [
                    {"text": "Here you go:"},
                    {"function_response": {"name": "get_weather", "response": {"t": 18}}},
                    {"function_response": {"name": "get_time", "response": {"t": "21:04"}}},
                ],
            },
        ]
        messages = stored(gemini.to_openai(contents))
        assert [m["role"] for m in messages] == ["assistant", "tool", "tool", "user"]
        assert gemini.from_openai(messages).contents == contents

    def test_an_edited_message_is_mapped_from_its_new_content(self) -> None:
        """A stored message changed after conversion (a compaction's cut) is not overwritten by the kept one."""
        messages = stored(gemini.to_openai(CONTENTS))
        messages[1]["content"] = "[cut]"
        messages[2]["content"] = "[pruned]"
        back = gemini.from_openai(messages).contents
        assert back[1]["parts"][0] == {"text": "[cut]"}
        assert [next(iter(p)) for p in back[1]["parts"]] == ["text", "function_call", "function_call"]
        assert back[2]["parts"][0] == {
            "function_response": {"name": "get_time", "response": {"output": "[pruned]"}}
        }

    @pytest.mark.parametrize(
        ("contents", "message"),
        [
            ("hello", "contents is a list"),
            ([{"role": "system", "parts": [{"text": "x"}]}], "content 0: the role is user or model"),
            ([{"role": "user", "parts": "x"}], "content 0: parts is a list"),
            (
                [{"role": "user", "parts": [{"text": "x"}], "extra": 1}],
                "content 0: a Content has role and parts",
            ),
            ([{"role": "user", "parts": ["x"]}], "content 0 part 0: a part is an object"),
            ([{"parts": [{"text": "x", "inline_data": {}}]}], "content 0 part 0: a part holds one of"),
            (
                [{"parts": [{"inlineData": {"mimeType": "image/png"}}]}],
                "inline_data needs mime_type and data",
            ),
            ([{"parts": [{"text": "x", "inline_data": None}]}], "inline_data is an object"),
            ([{"role": "model", "parts": [{"function_call": {"args": {}}}]}], "function_call needs a name"),
            ([{"role": "model", "parts": [{"function_call": {"name": "f", "args": [1]}}]}], "args is a JSON"),
            (
                [CONTENTS[1], {"parts": [{"function_response": {"name": "nope", "response": {}}}]}],
                "content 1 part 0: a function_response for 'nope'",
            ),
            ([{"parts": [{"text": "x", "Text": "y"}]}], "text given twice"),
        ],
    )
    def test_rejects_what_gemini_does_not_allow(self, contents: Any, message: str) -> None:
        with pytest.raises(FormatError, match=message):
            gemini.to_openai(contents)

    def test_rejects_a_system_instruction_given_twice(self) -> None:
        with pytest.raises(FormatError, match="both in the request and given apart"):
            gemini.to_openai({"contents": [], "system_instruction": SYSTEM}, SYSTEM)

    def test_rejects_a_tool_result_for_no_call(self) -> None:
        with pytest.raises(FormatError, match="message 1: a tool result for 'x'"):
            gemini.from_openai(
                [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "1"}]
            )
