"""Issue 9: every message a summary replaces was read by the summarizer, however far the span is over its input.

A real worker, broker and Redis; the summarizer is the fake LLM behind LiteLLM, its input
capped at 1,500 tokens. The first compaction's LLM call is slow, and 60 turns arrive while
it runs, so the next span is several times the cap. Every message carries a marker word
of its own; every marker of a message that a summary chunk covers must appear in some
request the fake LLM received. Before issue 9 the summarizer dropped the middle of such a
span behind a notice, and those messages were covered without being read.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import Outcome, TurnEvent
from compaction_worker.runtime.worker import build_worker
from compaction_worker.strategies.truncate import TRUNCATION_MODEL
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import make_settings

from .helpers import (
    compaction_events,
    coverage_problems,
    poll_until,
    publish_many,
    read_topic,
    settle,
)

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

CID = "conv-read-all"
WINDOW = 8192
INPUT_CAP = 1500
LLM_DELAY = 6.0
ARRIVING = 60
"""Turns published while the first compaction waits on its slow LLM call."""
MARKER = re.compile(r"\bzq\d{3}[uctr]x\b")
FILLER = (
    "The deployment notes mention the staging cluster, the rollout order, the health checks "
    "and the owners to page when a check fails during the night."
)


def marker(seq: int, kind: str) -> str:
    return f"zq{seq:03d}{kind}x"


def turn(seq: int) -> TurnEvent:
    """Odd turns: a user request. Even turns: a tool call, its result and a reply. Each message marked."""
    if seq % 2:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Request {marker(seq, 'u')}: check service {seq}. {FILLER}"}
        ]
    else:
        call_id = "call_0"  # numbered per turn, as several runtimes do
        messages = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": f'{{"path": "src/svc_{seq}.py", "tag": "{marker(seq, "c")}"}}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": f"{marker(seq, 't')} {FILLER} {FILLER}"},
            {"role": "assistant", "content": f"Done {marker(seq, 'r')}: service {seq} is healthy. {FILLER}"},
        ]
    return turn_event(CID, seq, messages, context_window=WINDOW)


def short_summary(body: dict[str, Any]) -> str:
    """A valid summary far below any budget, so that every piece's summary is accepted."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return f"## Current state\n- {user.count('[')} transcript blocks read; services checked."


def markers_of(message: dict[str, Any]) -> set[str]:
    text = str(message.get("content") or "")
    text += "".join(str(c["function"]["arguments"]) for c in message.get("tool_calls") or ())
    return set(MARKER.findall(text))


@pytest.mark.slow
async def test_every_summarized_message_reached_a_summarizer_request(
    kafka_bootstrap: str, redis_url: str, make_topics: MakeTopics, fake_llm: FakeLLMServer
) -> None:
    """60 turns arrive during a slow call; the span after it is read in pieces, every covered message sent."""
    fake_llm.set_responder(short_summary)
    fake_llm.set_delay(LLM_DELAY)
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=1)
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        kafka={"consumers": 1},
        summarizer={
            "model": "openai/fake-summarizer",
            "api_base": fake_llm.url,
            "api_key": "fake-key-0123456789",
            "max_input_tokens": INPUT_CAP,
        },
    )
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:

        async def llm_idle() -> bool:  # no call of an earlier test's workers still counts
            return fake_llm.in_flight == 0

        async def compaction_in_llm_call() -> bool:
            return fake_llm.in_flight > 0

        await poll_until(llm_idle, 30, "the fake LLM idle")
        seq = 0
        while not fake_llm.in_flight:
            seq += 1
            assert seq < 400, "no compaction started"
            await client.publish_turn(turn(seq))
            if seq % 10 == 0:
                await poll_until(functools.partial(_stored, client, seq), 30, f"turn {seq} stored")
        await poll_until(compaction_in_llm_call, 30, "the first compaction calling the LLM", interval=0.01)
        first_call = len(fake_llm.requests)

        arriving = [turn(s) for s in range(seq + 1, seq + ARRIVING + 1)]
        await publish_many(
            client,
            [(e.conversation_id.encode(), e.model_dump_json(exclude_none=True).encode()) for e in arriving],
        )
        last = seq + ARRIVING
        await poll_until(functools.partial(_stored, client, last), 30, "the arriving turns stored")
        assert len(fake_llm.requests) == first_call, "the arriving turns were stored during the slow call"
        assert (await client.meta(CID)).version == 0
        fake_llm.set_delay(0)
        await settle([worker], last, within=120)

        snapshot = await client.snapshot(CID)
        transcript = await client.transcript(CID)
        _, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )

    assert coverage_problems(snapshot.history, len(transcript)) == []
    compactions = [c for c in completed[CID] if c.outcome is Outcome.COMPACTED]
    assert len(compactions) >= 2, [(c.outcome, c.error) for c in completed[CID]]
    assert all(c.summarizer_model == "openai/fake-summarizer" for c in compactions), [
        (c.summarizer_model, c.error) for c in compactions
    ]
    assert all(chunk.model != TRUNCATION_MODEL for chunk in snapshot.history.chunks)
    # A span several times the cap went to the LLM in pieces, and the event says so.
    assert len(fake_llm.requests) > len(compactions)
    assert any("pieces" in note for c in compactions for note in c.notes), [c.notes for c in compactions]

    sent = "\n".join(
        m["content"] for body in fake_llm.requests for m in body["messages"] if m["role"] == "user"
    )
    covered = [r for r in transcript if any(chunk.covers(r["n"]) for chunk in snapshot.history.chunks)]
    unread = [r["n"] for r in covered if not markers_of(r["m"]) <= set(MARKER.findall(sent))]
    print(f"\n{len(covered)} messages summarized, {len(unread)} of them never sent to the LLM")
    assert len(covered) > ARRIVING
    assert all(markers_of(r["m"]) for r in covered)
    assert unread == []


async def _stored(client: Client, seq: int) -> bool:
    return (await client.meta(CID)).last_seq >= seq
