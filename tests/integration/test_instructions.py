"""Compaction instructions through the real broker and Redis: a request's and a conversation's
standing ones reach the LLM's prompt, fenced, and ``compaction.completed`` says which applied."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger, TurnEvent
from compaction_worker.runtime.worker import Worker
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings, running_worker

from .helpers import conversation_events

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
WINDOW = 8000
MAX_OUTPUT = 500
ASKED = "Keep the migration plan and every failing test name."
STANDING = "Always keep the deployment hostnames verbatim."


@dataclass
class Running:
    """The module's worker and client, on topics of their own."""

    worker: Worker
    client: Client
    settings: Settings

    async def completed(self, cid: str, count: int) -> list[CompactionCompleted]:
        """The conversation's completion events, once there are ``count`` of them (in order)."""
        events = await conversation_events(self.settings, self.settings.topics.completed, cid, count)
        return [CompactionCompleted.model_validate(e) for e in events]


@pytest.fixture(scope="module")
async def running(
    kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer
) -> AsyncIterator[Running]:
    """One worker for the module, its summarizer the fake LLM server."""
    topics = fresh_topics()
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm_server),
    )
    async with running_worker(settings) as (worker, client):
        yield Running(worker, client, settings)


def _turn(cid: str, seq: int, **fields: Any) -> TurnEvent:
    """Turn ``seq``: about 150 tokens of a user's or the assistant's words, naming a plan, a test, a host."""
    role = "user" if seq % 2 else "assistant"
    words = " ".join(f"{role}{seq}-word{i}" for i in range(40))
    text = f"turn {seq} of {cid}: the migration plan step {seq}; tests/test_m{seq}.py failed on db{seq}.internal; {words}"
    if seq == 1:
        fields.setdefault("system_prompt", "You are a careful assistant.")
    return turn_event(
        cid,
        seq,
        [{"role": role, "content": text}],
        MODEL,
        context_window=WINDOW,
        max_output_tokens=MAX_OUTPUT,
        **fields,
    )


def _prompts(fake_llm: FakeLLMServer, cid: str) -> list[str]:
    """The user messages of the summary calls about ``cid``."""
    found = []
    for body in fake_llm.requests:
        text = "\n".join(str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user")
        if cid in text:
            found.append(text)
    return found


def _fenced(prompt: str) -> str:
    """The text inside the prompt's one instructions fence (which must come after the transcript)."""
    assert prompt.count("<compaction_instructions>") == prompt.count("</compaction_instructions>") == 1
    assert prompt.index("</transcript>") < prompt.index("<compaction_instructions>")
    return prompt.split("<compaction_instructions>\n")[1].split("\n</compaction_instructions>", maxsplit=1)[0]


async def test_a_manual_requests_instructions_add_to_the_turns_standing_ones(
    running: Running, fake_llm: FakeLLMServer
) -> None:
    """A turn's ``compaction_instructions`` stand; a manual request's add to them: both reach the
    LLM's prompt inside the fence, and compaction.completed reports both."""
    client = running.client
    cid = f"asked-{uuid.uuid4().hex[:8]}"
    turns = 24  # about 3,600 tokens: under the threshold, so only the request compacts
    for seq in range(1, turns + 1):
        await client.publish_turn(_turn(cid, seq, compaction_instructions=STANDING if seq == 3 else None))
    await client.wait_for(cid)
    assert (await client.meta(cid)).instructions == STANDING
    assert not _prompts(fake_llm, cid)

    await client.request_compaction(cid, turns + 1, MODEL, instructions=ASKED)
    (done,) = await running.completed(cid, 1)

    assert (done.trigger, done.outcome) == (Trigger.MANUAL, Outcome.COMPACTED), done.error
    assert done.instructions == f"{STANDING}\n\n{ASKED}"
    (prompt,) = _prompts(fake_llm, cid)
    assert _fenced(prompt) == f"{STANDING}\n\n{ASKED}"
    # The request's instructions were for that compaction only; the standing ones stay.
    assert (await client.meta(cid)).instructions == STANDING


async def test_the_clients_standing_instructions_apply_to_a_threshold_compaction(
    running: Running, fake_llm: FakeLLMServer
) -> None:
    """``Client.set_instructions`` before the turns: the threshold compaction applies them; a turn's
    empty ``compaction_instructions`` clears them, and the next compaction applies none."""
    client = running.client
    cid = f"standing-{uuid.uuid4().hex[:8]}"
    await client.set_instructions(cid, STANDING)
    seq = 0
    while not (await client.meta(cid)).version:  # until the threshold's compaction commits
        seq += 1
        await client.publish_turn(_turn(cid, seq))
        if seq % 10 == 0:
            await client.wait_for(cid)
        assert seq < 120, "the threshold never compacted"
    await client.wait_for(cid)
    first = (await running.completed(cid, 1))[0]
    assert first.trigger is Trigger.THRESHOLD
    assert first.instructions == STANDING
    prompts = _prompts(fake_llm, cid)
    assert prompts
    assert all(_fenced(p) == STANDING for p in prompts)

    seq += 1
    await client.publish_turn(_turn(cid, seq, compaction_instructions=""))
    await client.wait_for(cid)
    assert (await client.meta(cid)).instructions == ""
    fake_llm.reset()
    count = len(await running.completed(cid, 1))
    await client.request_compaction(cid, seq + 1, MODEL)
    last = (await running.completed(cid, count + 1))[-1]
    assert last.trigger is Trigger.MANUAL
    assert last.instructions is None
    assert all("compaction_instructions" not in p for p in _prompts(fake_llm, cid))
