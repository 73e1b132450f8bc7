"""Profiles and approval through the real broker and Redis (issue 37): a sub-agent's conversation
compacts on its own profile's terms; an approval-mode conversation gets ``compaction.proposed``,
and ``Client.apply`` commits exactly what was proposed (the LLM's summary is not asked for again)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionProposed, Outcome, Trigger
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings, running_worker

from .helpers import conversation_events

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
WINDOW = 8000
PROFILES = {
    "subagent": {"budget": {"trigger_fraction": 0.3, "target_fraction": 0.15}},
    # Due at half of what the window leaves for input (3,000 tokens): the proposal has turns after
    # it, all under the 6,000 at which a history no longer waits for approval.
    "reviewed": {
        "pipeline": {"approval": "manual"},
        "budget": {"trigger_fraction": 0.5, "target_fraction": 0.3},
    },
}
REVIEWED_TURNS = 30
"""About 5,700 tokens of :func:`_turn`s: past the reviewed profile's threshold, under its window's 6,000."""


@dataclass
class Running:
    client: Client
    settings: Settings

    async def events(self, topic: str, cid: str, count: int) -> list[dict[str, Any]]:
        return await conversation_events(self.settings, topic, cid, count)


@pytest.fixture(scope="module")
async def running(
    kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer
) -> AsyncIterator[Running]:
    """One worker with two profiles, its summarizer the fake LLM server."""
    topics = fresh_topics()
    settings = make_settings(
        kafka_bootstrap, redis_url, topics, summarizer=fake_summarizer(fake_llm_server), profiles=PROFILES
    )
    async with running_worker(settings) as (_, client):
        yield Running(client, settings)


def _turn(cid: str, seq: int, **fields: Any) -> Any:
    """Turn ``seq``: about 150 tokens of a user's or the assistant's words."""
    role = "user" if seq % 2 else "assistant"
    words = " ".join(f"{role}{seq}-word{i}" for i in range(40))
    text = f"turn {seq} of {cid}: the migration plan step {seq}; tests/test_m{seq}.py failed; {words}"
    return turn_event(cid, seq, [{"role": role, "content": text}], MODEL, context_window=WINDOW, **fields)


async def test_a_subagent_compacts_on_its_own_terms_beside_its_parent(running: Running) -> None:
    """Same turns: the sub-agent (profile by a turn field) compacts; the parent, on the deployment's
    threshold, does not; the context meter shows each its own threshold."""
    client = running.client
    parent, child = f"parent-{uuid.uuid4().hex[:8]}", f"child-{uuid.uuid4().hex[:8]}"
    for seq in range(1, 21):
        await client.publish_turn(_turn(parent, seq))
        await client.publish_turn(_turn(child, seq, **({"profile": "subagent"} if seq == 1 else {})))
    await client.wait_for(parent, timeout=90)
    await client.wait_for(child, timeout=90)  # it compacts more than once, each with an LLM call

    assert (await client.meta(child)).version >= 1
    assert (await client.meta(parent)).version == 0
    stats_parent, stats_child = await client.context_stats(parent), await client.context_stats(child)
    assert stats_child.threshold < stats_parent.threshold


async def test_approval_proposes_and_apply_commits_exactly_the_proposal(
    running: Running, fake_llm_server: FakeLLMServer
) -> None:
    """``Client.set_profile`` to an approval profile: the threshold run publishes compaction.proposed
    and commits nothing; turns after it make it stale, so ``Client.apply`` recomputes it (a new
    proposal replaces it, the old one ends ``discarded``); applied while current, it commits exactly
    the history ``Client.proposal`` showed, with no second LLM call, under the proposal's id."""
    client = running.client
    topics = running.settings.topics
    cid = f"reviewed-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="not one of the settings' profiles"):
        await client.set_profile(cid, "reviewd")
    await client.set_profile(cid, "reviewed")
    # The threshold crosses before the last two turns; they follow once the proposal is made, so
    # that they make it stale whatever the worker's pace (sent at once, all could be stored first).
    for seq in range(1, REVIEWED_TURNS - 1):
        await client.publish_turn(_turn(cid, seq))
    await client.wait_for(cid, timeout=90)
    (first,) = await running.events(topics.proposed, cid, 1)
    for seq in range(REVIEWED_TURNS - 1, REVIEWED_TURNS + 1):
        await client.publish_turn(_turn(cid, seq))
    await client.wait_for(cid, timeout=90)
    CompactionProposed.model_validate(first)
    assert first["trigger"] == Trigger.THRESHOLD.value
    assert first["last_seq"] < REVIEWED_TURNS, (
        "the threshold crossed at the last turn: nothing turns it stale"
    )
    assert (await client.meta(cid)).version == 0

    assert await client.apply(cid, first["compaction_id"]) is None
    _, second = await running.events(topics.proposed, cid, 2)
    assert (second["trigger"], second["last_seq"], second["replaces"]) == (
        "manual",
        REVIEWED_TURNS,
        first["compaction_id"],
    )
    (dropped,) = await running.events(topics.completed, cid, 1)
    assert (dropped["compaction_id"], dropped["outcome"]) == (first["compaction_id"], "discarded")

    shown = await client.proposal(cid)
    assert shown is not None
    assert str(shown.compaction_id) == second["compaction_id"]
    calls = len(fake_llm_server.requests)
    done = await client.apply(cid, second["compaction_id"])

    assert done is not None
    assert (done.outcome, str(done.compaction_id), done.version) == (
        Outcome.COMPACTED,
        second["compaction_id"],
        1,
    )
    assert len(fake_llm_server.requests) == calls
    assert await client.messages(cid) == shown.messages
    assert await client.proposal(cid) is None
    _, completed = await running.events(topics.completed, cid, 2)
    assert completed["compaction_id"] == second["compaction_id"]
