"""complete(): the effective history in, a reactive compaction and one retry on overflow, the turn out."""

from __future__ import annotations

from typing import Any, cast

import pytest

from compaction_worker.client import Client, complete
from compaction_worker.contracts.events import CompactionMode, TurnEvent
from compaction_worker.testing import FakeLLMServer

MODEL = "openai/fake-agent"
SUMMARY = {"role": "user", "content": "## Summary of turns 1-2\nearlier work"}


class StubClient:
    """The Client methods complete() uses, over a list; a requested compaction replaces the history."""

    def __init__(self, history: list[dict[str, Any]]) -> None:
        self.history = history
        self.published: list[TurnEvent] = []
        self.seq = 2
        self.waits = 0

    async def wait_for(
        self,
        conversation_id: str,
        version: int | None = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109  # the signature of the Client method it stands in for
    ) -> int:
        self.waits += 1
        return 0

    async def next_turn_seq(self, conversation_id: str) -> int:
        self.seq += 1
        return self.seq

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        return list(self.history)

    async def request_compaction(
        self, conversation_id: str, turn_seq: int, model: str, error: str | None = None
    ) -> TurnEvent:
        event = TurnEvent.model_validate(
            {
                "conversation_id": conversation_id,
                "turn_seq": turn_seq,
                "model": model,
                "compaction": {"mode": "overflow" if error else "force", "error": error},
            }
        )
        self.published.append(event)
        self.history = [SUMMARY]
        return event

    async def publish_turn(self, event: TurnEvent) -> None:
        self.published.append(event)


def _client(stub: StubClient) -> Client:
    return cast(Client, stub)


def _plain(event: TurnEvent) -> list[dict[str, Any]]:
    """The turn's messages as sent (without the private ``pinned`` default)."""
    return [{k: v for k, v in m.to_dict().items() if k != "pinned"} for m in event.messages]


OLD = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}]
NEW = [{"role": "user", "content": "and now?"}]


async def test_overflow_compacts_then_the_retry_succeeds(fake_llm: FakeLLMServer) -> None:
    """An overflow becomes a reactive compaction request with the provider's text; the retry sends the compacted history."""
    fake_llm.overflow_next(1, "openai", actual=9000, maximum=8192)
    fake_llm.set_reply("done")
    stub = StubClient(list(OLD))
    response = await complete(
        _client(stub), "c-1", model=MODEL, messages=NEW, api_base=fake_llm.url, api_key="fake"
    )
    assert response.choices[0].message.content == "done"
    first, retry = fake_llm.requests
    assert first["messages"] == [*OLD, *NEW]
    assert retry["messages"] == [SUMMARY, *NEW]
    request, turn = stub.published
    assert request.compaction is not None
    assert (request.turn_seq, request.compaction.mode) == (3, CompactionMode.OVERFLOW)
    assert "maximum context length is 8192 tokens" in (request.compaction.error or "")
    assert turn.turn_seq == 4
    assert _plain(turn) == [*NEW, {"role": "assistant", "content": "done"}]
    assert turn.usage is not None
    assert turn.usage.prompt_tokens > 0
    assert stub.waits == 2  # before the first call, and for the compaction


async def test_a_second_overflow_is_raised(fake_llm: FakeLLMServer) -> None:
    """A retry that overflows again raises the provider's error; no turn is published."""
    fake_llm.overflow_next(2)
    stub = StubClient(list(OLD))
    with pytest.raises(Exception, match="maximum context length") as raised:
        await complete(_client(stub), "c-1", model=MODEL, messages=NEW, api_base=fake_llm.url, api_key="fake")
    assert type(raised.value).__name__ == "ContextWindowExceededError"
    assert len(fake_llm.requests) == 2
    assert [e.compaction is not None for e in stub.published] == [True]


async def test_other_errors_are_raised_without_compaction(fake_llm: FakeLLMServer) -> None:
    """An error that is no overflow (here a 400) goes straight back to the caller."""
    fake_llm.fail_next(1, status=400)
    stub = StubClient(list(OLD))
    with pytest.raises(Exception, match="injected failure"):
        await complete(_client(stub), "c-1", model=MODEL, messages=NEW, api_base=fake_llm.url, api_key="fake")
    assert stub.published == []


async def test_the_published_turn_carries_the_tool_calls() -> None:
    """The assistant's tool calls (parallel ones too) are published with the turn, ids and arguments intact."""
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "grep", "arguments": '{"q": "x"}'}},
    ]
    stub = StubClient(list(OLD))
    response = await complete(
        _client(stub), "c-1", model=MODEL, messages=NEW, mock_response="", mock_tool_calls=calls
    )
    (turn,) = stub.published
    assert [c.id for c in response.choices[0].message.tool_calls] == ["call_a", "call_b"]
    assert _plain(turn)[-1] == {"role": "assistant", "content": "", "tool_calls": calls}


async def test_tool_schemas_reach_the_provider(fake_llm: FakeLLMServer) -> None:
    """A call with ``tools=`` goes through LiteLLM's real request path (it imports ``mcp`` then)."""
    tools = [
        {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}
    ]
    fake_llm.set_reply("done")
    stub = StubClient(list(OLD))
    response = await complete(
        _client(stub), "c-1", model=MODEL, messages=NEW, tools=tools, api_base=fake_llm.url, api_key="fake"
    )
    assert response.choices[0].message.content == "done"
    (request,) = fake_llm.requests
    assert request["tools"] == tools
