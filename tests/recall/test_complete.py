"""complete(recall=True) against the fake provider, with a stub client: the tool list and a mixed reply."""

from __future__ import annotations

import json
from typing import Any, cast

from compaction_worker.client import Client, complete
from compaction_worker.contracts.events import TurnEvent
from compaction_worker.recall import OPENAI_TOOL, RecallHit, RecallResult
from compaction_worker.testing import FakeLLMServer

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
HIT = RecallHit("transcript", 2, 3, "tool", "ERROR lost lease on kestrel-42", 0, 1.5)


class RecallingClient:
    """The Client methods complete() uses: an empty history, a recall that always finds HIT."""

    def __init__(self) -> None:
        self.published: list[TurnEvent] = []
        self.queries: list[tuple[str, int | None]] = []

    async def wait_for(self, conversation_id: str, **_: Any) -> int:
        return 0

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        return []

    async def next_turn_seq(self, conversation_id: str) -> int:
        return len(self.published) + 1

    async def publish_turn(self, event: TurnEvent) -> None:
        self.published.append(event)

    async def recall(self, conversation_id: str, query: str, *, limit: int | None = None) -> RecallResult:
        self.queries.append((query, limit))
        return RecallResult([HIT], 1, 3, 0)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


async def test_a_reply_mixing_recall_with_the_runtimes_tools_returns_with_recall_answered(
    fake_llm: FakeLLMServer,
) -> None:
    """One model call: the recall call is answered in the stored turn, the bash call is left to the runtime."""
    calls = [
        _call("a", "recall", {"query": "kestrel lease", "limit": 3}),
        _call("b", "bash", {"command": "ls"}),
    ]
    fake_llm.set_responder(lambda _body: {"content": None, "tool_calls": calls})
    stub = RecallingClient()
    new = [{"role": "user", "content": "why did the lease drop?"}]
    response = await complete(
        cast(Client, stub),
        "c",
        model="openai/fake",
        messages=new,
        api_base=fake_llm.url,
        api_key="fake",
        tools=[BASH],
        recall=True,
    )
    assert [c.function.name for c in response.choices[0].message.tool_calls] == ["recall", "bash"]
    assert len(fake_llm.requests) == 1
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == ["bash", "recall"]
    assert stub.queries == [("kestrel lease", 3)]
    [turn] = stub.published
    stored = [m.to_dict() for m in turn.messages]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool"]
    assert stored[2]["tool_call_id"] == "a"
    assert json.loads(stored[2]["content"])["results"][0]["text"] == HIT.text


async def test_a_recall_tool_already_given_is_not_added_twice_and_without_the_flag_nothing_is_answered(
    fake_llm: FakeLLMServer,
) -> None:
    fake_llm.set_responder(
        lambda _body: {"content": None, "tool_calls": [_call("a", "recall", {"query": "x"})]}
    )
    stub = RecallingClient()
    kwargs: dict[str, Any] = {"model": "openai/fake", "api_base": fake_llm.url, "api_key": "fake"}
    await complete(cast(Client, stub), "c", tools=[OPENAI_TOOL], recall=True, recall_rounds=0, **kwargs)
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == ["recall"]
    assert len(stub.queries) == 1  # answered, and no second call: no rounds allowed
    await complete(cast(Client, stub), "c", tools=[OPENAI_TOOL], **kwargs)
    assert len(stub.queries) == 1  # recall=False: the runtime's to answer
    assert [m.role for m in stub.published[-1].messages] == ["assistant"]


async def test_a_recall_call_with_unreadable_arguments_is_answered_with_the_error(
    fake_llm: FakeLLMServer,
) -> None:
    bad = {"id": "a", "type": "function", "function": {"name": "recall", "arguments": "query=lease"}}
    replies: list[str | dict[str, Any]] = [{"content": None, "tool_calls": [bad]}, "done"]
    fake_llm.set_responder(lambda _body: replies.pop(0))
    stub = RecallingClient()
    kwargs: dict[str, Any] = {"model": "openai/fake", "api_base": fake_llm.url, "api_key": "fake"}
    response = await complete(cast(Client, stub), "c", recall=True, **kwargs)
    assert response.choices[0].message.content == "done"
    assert stub.queries == []
    answer = fake_llm.requests[1]["messages"][-1]
    assert answer["tool_call_id"] == "a"
    assert "query" in json.loads(answer["content"])["error"]
