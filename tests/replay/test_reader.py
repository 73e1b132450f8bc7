"""Reading recorded conversations: both JSONL layouts, every adapter's shape, bad lines by number."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, message_to_dict

from compaction_worker.contracts.events import ChatMessage
from compaction_worker.replay.reader import LineError, read_file, read_paths
from tests.trajectories import load_trajectories

FIXTURES = Path(__file__).parent / "fixtures"


def _write(path: Path, *records: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


class TestMessagePerLine:
    def test_the_file_is_one_conversation(self) -> None:
        """The fixture (one OpenAI chat message per line) reads as one conversation named for the file."""
        result = read_file(FIXTURES / "agent_session.jsonl")
        assert result.errors == []
        (conversation,) = result.conversations
        assert conversation.name == "agent_session"
        assert len(conversation.messages) == 97
        assert conversation.messages[0]["role"] == "system"
        assert conversation.messages[2]["tool_calls"][0]["id"] == "call_001"
        assert conversation.messages[3] == {
            **conversation.messages[3],
            "role": "tool",
            "tool_call_id": "call_001",
        }

    def test_bad_lines_are_reported_by_number_and_the_rest_is_read(self, tmp_path: Path) -> None:
        path = _write(
            tmp_path / "chat.jsonl",
            {"role": "user", "content": "hello"},
            '{"role": "assistant", "content": ',  # cut off
            {"role": "assistant", "content": "hi"},
            [1, 2],
            {"role": "robot", "content": "beep"},
            {"role": "user", "content": "bye"},
        )
        result = read_file(path)
        assert [(e.line, e.reason.split(":")[0]) for e in result.errors] == [
            (2, "not JSON"),
            (4, "not a JSON object but list"),
            (5, "not a valid chat message"),
        ]
        assert str(result.errors[0]).startswith(f"{path}:2: not JSON")
        (conversation,) = result.conversations
        assert [m["content"] for m in conversation.messages] == ["hello", "hi", "bye"]

    def test_anthropic_messages_are_converted(self, tmp_path: Path) -> None:
        path = _write(
            tmp_path / "claude.jsonl",
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py b.py"}],
            },
        )
        (conversation,) = read_file(path).conversations
        assert [m["role"] for m in conversation.messages] == ["user", "assistant", "tool"]
        assert conversation.messages[1]["tool_calls"][0]["function"]["name"] == "ls"
        assert conversation.messages[2]["tool_call_id"] == "toolu_1"

    def test_a_gemini_request_is_converted_with_its_system_instruction(self, tmp_path: Path) -> None:
        """A conversation line in Gemini's shape: the instruction first, function calls paired."""
        path = _write(
            tmp_path / "gemini.jsonl",
            {
                "conversation_id": "g",
                "systemInstruction": {"parts": [{"text": "Be terse."}]},
                "contents": [
                    {"role": "user", "parts": [{"text": "list the files"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"path": "."}}}]},
                    {
                        "role": "user",
                        "parts": [{"functionResponse": {"name": "ls", "response": {"out": "a.py"}}}],
                    },
                ],
            },
        )
        (conversation,) = read_file(path).conversations
        assert [m["role"] for m in conversation.messages] == ["system", "user", "assistant", "tool"]
        assert conversation.messages[0]["content"] == "Be terse."
        call_id = conversation.messages[2]["tool_calls"][0]["id"]
        assert conversation.messages[3]["tool_call_id"] == call_id

    def test_responses_items_are_converted_together(self, tmp_path: Path) -> None:
        """A function_call item joins the assistant message before it, across lines."""
        path = _write(
            tmp_path / "responses.jsonl",
            {"role": "user", "content": "weather?"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "checking"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        )
        (conversation,) = read_file(path).conversations
        assert [m["role"] for m in conversation.messages] == ["user", "assistant", "tool"]
        assert conversation.messages[1]["tool_calls"][0]["id"] == "c1"

    def test_langchain_dicts_are_converted(self, tmp_path: Path) -> None:
        path = _write(
            tmp_path / "lc.jsonl",
            message_to_dict(HumanMessage("hi")),
            message_to_dict(AIMessage("hello")),
        )
        (conversation,) = read_file(path).conversations
        assert [(m["role"], m["content"]) for m in conversation.messages] == [
            ("user", "hi"),
            ("assistant", "hello"),
        ]


class TestConversationPerLine:
    def test_each_line_is_a_conversation_with_its_model_tools_and_window(self, tmp_path: Path) -> None:
        tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
        path = _write(
            tmp_path / "many.jsonl",
            {"id": "a", "model": "gpt-4o", "tools": tools, "messages": [{"role": "user", "content": "1"}]},
            {"messages": [{"role": "user", "content": "2"}], "context_window": 8000},
            {"messages": [{"role": "nobody"}]},
            {
                "id": "claude",
                "system": "be brief",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "3"}]}],
            },
            {"id": "resp", "instructions": "be kind", "input": [{"role": "user", "content": "4"}]},
        )
        result = read_file(path)
        assert [(e.line, e.reason.split(":")[0]) for e in result.errors] == [(3, "not a valid chat message")]
        first, second, claude, resp = result.conversations
        assert (first.name, first.model, first.tools) == ("a", "gpt-4o", tuple(tools))
        assert (second.name, second.model, second.context_window) == ("many:2", None, 8000)
        assert claude.messages[0] == {"role": "system", "content": "be brief", "pinned": False}
        assert [m["role"] for m in resp.messages] == ["system", "user"]

    def test_a_shape_the_adapter_cannot_take_is_one_line_s_error(self, tmp_path: Path) -> None:
        blocks = [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]
        path = _write(
            tmp_path / "odd.jsonl",
            {"system": [1], "messages": [{"role": "user", "content": blocks}]},
            {"messages": [{"type": "human", "data": {}}]},
            {"messages": [{"role": "user", "content": "fine"}]},
        )
        result = read_file(path)
        assert [(e.line, e.reason.split(":")[0]) for e in result.errors] == [
            (1, "not anthropic messages"),
            (2, "not a LangChain message"),
        ]
        assert all("\n" not in e.reason for e in result.errors)
        assert [c.name for c in result.conversations] == ["odd:3"]

    def test_a_message_line_among_conversation_lines_is_an_error(self, tmp_path: Path) -> None:
        path = _write(
            tmp_path / "mixed.jsonl",
            {"messages": [{"role": "user", "content": "1"}]},
            {"role": "user", "content": "stray"},
        )
        result = read_file(path)
        assert len(result.conversations) == 1
        assert result.errors == [
            LineError(path, 2, "a message line in a file of conversation lines"),
        ]


def test_a_directory_is_every_file_under_it_and_what_is_no_conversation_is_named_apart(
    tmp_path: Path,
) -> None:
    """Issue 56: subfolders are read too (hidden ones not); a README, a LICENSE, an empty or a binary
    file, a JSON document in no known layout are unrecognised, not errors; a bad line of a
    conversation file stays that line's error."""
    _write(tmp_path / "b.jsonl", {"role": "user", "content": "b"})
    _write(tmp_path / "a.jsonl", {"role": "user", "content": "a"})
    _write(tmp_path / "runs" / "deep" / "c.jsonl", {"role": "user", "content": "c"})
    _write(tmp_path / ".git" / "d.jsonl", {"role": "user", "content": "hidden"})
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "README.md").write_text('# recordings\n\n{"role": "user", "content": "an example"}\n')
    (tmp_path / "runs" / "LICENSE").write_text("MIT License\n\nCopyright (c)\n")
    (tmp_path / "runs" / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "package.json").write_text('{"name": "x", "version": "1"}\n')
    (tmp_path / "bad.jsonl").write_text('{"role": "user", "content": "hi"}\nnot json\n')

    result = read_paths([tmp_path])

    assert [c.name for c in result.conversations] == ["a", "b", "bad", "c"]
    assert result.unrecognised == [
        tmp_path / p for p in ("README.md", "empty.jsonl", "package.json", "runs/LICENSE", "runs/plot.png")
    ]
    assert [str(e) for e in result.errors] == [
        f"{tmp_path / 'bad.jsonl'}:2: not JSON: Expecting value: line 1 column 1 (char 0)"
    ]


def test_a_published_agent_trajectory_is_read_as_its_messages() -> None:
    """Issue 36: SWE-agent's and mini-swe-agent's files replay as they are published (one JSON
    document each), with the messages the trajectory loader of the tests reads."""
    for trajectory in load_trajectories():
        read = read_file(trajectory.path)

        assert read.errors == []
        (conversation,) = read.conversations
        assert conversation.name == trajectory.path.name.removesuffix(".json").removesuffix(".traj")
        assert conversation.messages == tuple(
            ChatMessage.model_validate(m).to_dict() for m in trajectory.messages
        )
