"""The memory contract black-box: through the real broker, Redis and a worker, what the user set survives
a threshold compaction and two manual ones with no new turn between, with the LLM down (the extractive
fallback), turns shaped as runtimes send them (a routing-prefixed model, ``call_0`` reused every turn)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome
from compaction_worker.contracts.history import text_of
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.summaries.standing import SUPERSEDED_TITLE
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings

from .helpers import read_topic

pytestmark = pytest.mark.integration

MODEL = "openrouter/openai/gpt-4o-mini"
WINDOW = 6000
SAID = {
    2: "Never execute shell commands without explicit approval.",
    4: "Keep the monthly cloud budget under 500 dollars.",
    6: "Please use metric units in every answer.",
    8: "We're migrating auth from sessions to JWT tokens.",
    10: "We decided to use Postgres 16 for the new service.",
    12: "Actually, raise the monthly cloud budget to 800 dollars.",
}
CURRENT = [SAID[2], SAID[6], SAID[8], SAID[10], SAID[12]]
TURNS = 40


@dataclass
class Running:
    client: Client
    settings: Settings


@pytest.fixture
async def running(kafka_bootstrap: str, redis_url: str, fake_llm: FakeLLMServer) -> AsyncIterator[Running]:
    """A worker whose LLM answers every summary request with a 503: the extractive fallback writes them."""
    fake_llm.fail_next(10_000, status=503)
    settings = make_settings(kafka_bootstrap, redis_url, fresh_topics(), summarizer=fake_summarizer(fake_llm))
    await ensure_topics(settings)
    try:
        async with build_worker(settings).running(), Client.connect(settings) as client:
            yield Running(client, settings)
    finally:
        fake_llm.reset()


def _turn(cid: str, seq: int) -> list[dict[str, object]]:
    """A user asking (stating an item on some turns), the agent calling a tool as ``call_0``, its result."""
    ask = f"{SAID[seq]} " if seq in SAID else ""
    words = " ".join(f"look{seq}x{i}" for i in range(30))
    return [
        {"role": "user", "content": f"{ask}Please check part {seq} of {cid}: {words}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "src/part{seq}.py"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": " ".join(f"line{seq}x{i}" for i in range(90))},
        {"role": "assistant", "content": f"Part {seq} reads fine."},
    ]


async def _completed(running: Running, cid: str) -> list[CompactionCompleted]:
    records = await read_topic(running.settings, running.settings.topics.completed, idle=0.5)
    return [e for e in map(CompactionCompleted.model_validate_json, records) if e.conversation_id == cid]


async def test_what_the_user_set_survives_three_compactions_with_the_llm_down(running: Running) -> None:
    """After each compaction every current item is in Client.messages word for word, the changed cap is
    marked no longer current, the newest step is verbatim, and the event reports nothing let go."""
    client, cid = running.client, f"memory-{uuid.uuid4().hex[:8]}"
    for seq in range(1, TURNS + 1):
        await client.publish_turn(turn_event(cid, seq, _turn(cid, seq), MODEL, context_window=WINDOW))
    await client.wait_for(cid, timeout=120)
    seq = TURNS
    for _ in range(2):  # two manual compactions, no new turn between
        seq += 1
        await client.request_compaction(cid, seq, MODEL)
        await client.wait_for(cid, timeout=120)
    done = [e for e in await _completed(running, cid) if e.outcome is Outcome.COMPACTED]
    assert len(done) >= 3, [(e.trigger, e.outcome, e.error) for e in await _completed(running, cid)]
    assert all(e.summarizer_model == "extractive" for e in done if e.summary_tokens)
    for event in done:
        assert event.standing_state is not None
        assert event.standing_state.let_go == {}, event
    messages = await client.messages(cid)
    text = "\n".join(text_of(m) for m in messages)
    assert [s for s in CURRENT if s not in text] == []
    current, _, superseded = text.partition(SUPERSEDED_TITLE)
    assert SAID[4] in superseded
    assert SAID[4] not in current
    # The newest step, verbatim: the last turn's call, its result and the reply.
    assert messages[-1] == {"role": "assistant", "content": f"Part {TURNS} reads fine."}
    assert messages[-2]["content"] == " ".join(f"line{TURNS}x{i}" for i in range(90))
