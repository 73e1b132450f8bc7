"""Recall through the real broker and Redis: a worker compacts, then the client finds what left the history."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from compaction_worker.client import Client, complete
from compaction_worker.contracts.history import text_of
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings, running_worker

pytestmark = pytest.mark.integration

FACT = "Keep the column legacy_invoice_ref: the auditor Priya Raman needs it until March."
LATER = "The invoice cache key is inv-v3-tenant, rotated at every schema change."
COMMAND = "kubectl rollout restart deployment/billing-7x -n prod"
FILLER = " ".join(f"I checked module part{i} of the billing parser and it looks fine." for i in range(40))
AGENT = "openai/fake-agent"


def _message(seq: int) -> dict[str, Any]:
    """Turn 4 states the fact and turn 6 the command, deep in assistant replies (user words are kept
    verbatim; the fake's summary keeps each message's first words only)."""
    if seq == 4:
        return {"role": "assistant", "content": f"Turn 4. {FILLER} {FACT}"}
    if seq == 10:
        return {"role": "assistant", "content": f"Turn 10. {FILLER} {LATER}"}
    if seq == 6:
        return {
            "role": "assistant",
            "content": f"Turn 6. {FILLER}\nThen I ran `{COMMAND}` and saw it come back.",
        }
    return {"role": "user" if seq % 2 else "assistant", "content": f"Turn {seq}. {FILLER}"}


@pytest.fixture
async def client(kafka_bootstrap: str, redis_url: str, fake_llm: FakeLLMServer) -> AsyncIterator[Client]:
    """A worker summarizing with the fake LLM and no ledger (the archive alone keeps artifacts), and a client."""
    topics = fresh_topics()
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm),
        pipeline={"artifact_budget_tokens": 0, "artifact_budget_fraction": 0},
    )
    async with running_worker(settings) as (_, connected):
        yield connected


async def _compacted(client: Client) -> str:
    """A conversation of 14 turns, compacted once by a manual request: turns 4 and 6 are summarized away."""
    cid = f"recall-{uuid.uuid4().hex[:8]}"
    for seq in range(1, 15):
        await client.publish_turn(turn_event(cid, seq, [_message(seq)]))
    await client.request_compaction(cid, 15, "gpt-4o-mini")
    version = await client.wait_for(cid, timeout=120)
    assert version >= 1
    shown = "\n".join(text_of(m) for m in await client.messages(cid))
    assert "legacy_invoice_ref" not in shown
    assert COMMAND not in shown
    return cid


async def test_recall_finds_a_fact_summarized_away_verbatim_with_its_turn(client: Client) -> None:
    """Issue 21 point 2: the fact and the command are out of the history; recall finds both, verbatim."""
    cid = await _compacted(client)
    found = await client.recall(cid, "which column does the auditor need?")
    best = found.hits[0]
    assert (best.source, best.turn_seq, best.role) == ("transcript", 4, "assistant")
    assert FACT in best.text
    original = (await client.transcript(cid))[best.n - 1]["m"]["content"]
    assert original[best.offset : best.offset + len(best.text)] == best.text
    assert found.messages >= 4
    assert found.version >= 1

    archived = await client.recall(cid, "rollout restart billing-7x", limit=10)
    artifacts = [h for h in archived.hits if h.source == "archive"]
    assert [(h.artifact_id, h.text, h.turn_seq) for h in artifacts] == [(f"cmd: {COMMAND}", COMMAND, 6)]
    # What the history still carries verbatim is not searched: the last turn is in its tail.
    assert not [h for h in (await client.recall(cid, "Turn 14")).hits if h.turn_seq == 14]
    assert (await client.recall("never-stored", "auditor")).hits == []


async def test_a_later_compaction_makes_more_searchable(client: Client) -> None:
    """The index is kept per history version: a second compaction's newly covered turns are found."""
    cid = await _compacted(client)
    before = await client.recall(cid, "invoice cache key rotated")
    assert 10 not in [h.turn_seq for h in before.hits]  # turn 10 is still in the verbatim tail
    for seq in range(16, 26):
        await client.publish_turn(turn_event(cid, seq, [_message(seq)]))
    await client.request_compaction(cid, 26, "gpt-4o-mini")
    await client.wait_for(cid, timeout=120)
    after = await client.recall(cid, "invoice cache key rotated")
    assert after.version > before.version
    assert after.hits[0].turn_seq == 10
    assert LATER in after.hits[0].text


async def test_complete_answers_the_models_recall_calls_itself(
    client: Client, fake_llm: FakeLLMServer
) -> None:
    """complete(recall=True): the model calls recall, complete() answers it and calls again; one turn stored."""
    cid = await _compacted(client)

    def agent(body: dict[str, Any]) -> str | dict[str, Any]:
        if body["model"] != "fake-agent":
            return "## Current state\n- summary"
        last = body["messages"][-1]
        if last["role"] == "tool":
            return "We must keep legacy_invoice_ref for the auditor."
        query = json.dumps({"query": "column the auditor needs"})
        return {"content": None, "tool_calls": [_call("r1", query)]}

    fake_llm.set_responder(agent)
    new = [{"role": "user", "content": "Which column did we promise to keep?"}]
    response = await complete(
        client, cid, model=AGENT, messages=new, api_base=fake_llm.url, api_key="fake", recall=True
    )
    assert response.choices[0].message.content == "We must keep legacy_invoice_ref for the auditor."
    calls = [r for r in fake_llm.requests if r.get("model") == "fake-agent"]
    assert len(calls) == 2
    assert any(t["function"]["name"] == "recall" for t in calls[0]["tools"])
    answer = json.loads(calls[1]["messages"][-1]["content"])
    assert answer["results"][0]["turn_seq"] == 4
    assert FACT in answer["results"][0]["text"]
    await client.wait_for(cid, timeout=60)
    stored = [r["m"] for r in await client.transcript(cid)][-4:]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1]["tool_calls"][0]["id"] == stored[2]["tool_call_id"] == "r1"


async def test_recall_rounds_are_bounded(client: Client, fake_llm: FakeLLMServer) -> None:
    """A model that only ever calls recall gets at most 1 + recall_rounds calls; every call is answered."""
    cid = await _compacted(client)
    count = 0

    def agent(body: dict[str, Any]) -> str | dict[str, Any]:
        nonlocal count
        if body["model"] != "fake-agent":
            return "## Current state\n- summary"
        count += 1
        return {"content": None, "tool_calls": [_call(f"r{count}", json.dumps({"query": "auditor"}))]}

    fake_llm.set_responder(agent)
    new = [{"role": "user", "content": "look back"}]
    await complete(
        client,
        cid,
        model=AGENT,
        messages=new,
        api_base=fake_llm.url,
        api_key="fake",
        recall=True,
        recall_rounds=2,
    )
    assert count == 3
    await client.wait_for(cid, timeout=60)
    stored = [r["m"] for r in await client.transcript(cid)][-7:]
    assert [m["role"] for m in stored] == ["user", *["assistant", "tool"] * 3]


def _call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": arguments}}
