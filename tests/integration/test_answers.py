"""Every turn gets an answer (issue 56): through the real broker, Redis and a running worker, a
runtime's ``wait_for(receipt)`` says what became of each turn it published: stored (with the pins it
asked that could not be applied), or rejected with the dead letter's reason and detail."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from compaction_worker.client import Client, Receipt
from compaction_worker.errors import TurnRejected
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_bytes, turn_event
from tests.orchestration import fresh_topics, make_settings, running_worker, user

from .helpers import conversation_events

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
USUAL_WAIT = 30.0
"""``wait_for``'s default timeout: every answer comes well within it."""
GAP_TIMEOUT = 2.0


@dataclass
class Running:
    client: Client
    settings: Settings


@pytest.fixture(scope="module")
async def running(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[Running]:
    """A worker with one profile and a short gap timeout (the extractive summarizer: no LLM)."""
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        fresh_topics(),
        profiles={"subagent": {"budget": {"trigger_fraction": 0.3, "target_fraction": 0.15}}},
        worker={"sweep_interval_seconds": 0.2, "gap_timeout_seconds": GAP_TIMEOUT},
    )
    async with running_worker(settings) as (_, client):
        yield Running(client, settings)


async def rejected(client: Client, receipt: Receipt) -> TurnRejected:
    """The TurnRejected the wait on ``receipt`` raises, within the usual wait."""
    start = time.monotonic()
    with pytest.raises(TurnRejected) as raised:
        await client.wait_for(receipt, timeout=USUAL_WAIT)
    assert time.monotonic() - start < USUAL_WAIT / 2
    return raised.value


async def test_a_colliding_turn_an_unknown_profile_and_an_impossible_pin_are_each_answered(
    running: Running,
) -> None:
    """The three silent cases of issue 56, each answered with its reason: a compaction request whose
    seq collides with a turn just published, a turn naming a profile the deployment lacks, and a turn
    asking to pin a message that is not there (stored, with the problem reported)."""
    client, cid = running.client, "answers"
    first = await client.publish_turn(turn_event(cid, 1, [user("deploy the parser")], MODEL))
    assert (first.conversation_id, first.turn_seq) == (cid, 1)
    assert (await client.wait_for(first)).turn_seq == 1

    # A helper drew seq 2 and published it; the runtime's own count said 2 as well.
    drawn = await client.publish_turn(
        turn_event(cid, await client.next_turn_seq(cid), [user("second")], MODEL)
    )
    assert drawn.turn_seq == 2
    collided = await client.request_compaction(cid, 2, MODEL)
    error = await rejected(client, collided)
    assert (error.conversation_id, error.turn_seq, error.reason) == (cid, 2, "conflicting_duplicate")
    assert str(error).startswith(f"{cid}: turn 2 was rejected (conflicting_duplicate): turn_seq 2 of {cid}")
    assert "publish this one again under the next seq" in str(error)
    assert (await client.wait_for(drawn)).turn_seq == 2  # the stored one is answered as stored
    # The DLQ topic keeps the operator's record, with the same reason and detail.
    (letter,) = await conversation_events(running.settings, running.settings.topics.dlq, cid, 1)
    assert (letter["reason"], letter["turn_seq"], letter["detail"]) == (
        "conflicting_duplicate",
        2,
        error.detail,
    )

    unknown = await client.publish_turn(turn_event(cid, 3, [user("as a sub-agent")], MODEL, profile="nope"))
    error = await rejected(client, unknown)
    assert (error.turn_seq, error.reason) == (3, "unknown_profile")
    assert "profile 'nope' is not one of the deployment's profiles (subagent)" in str(error)
    assert "name a profile the settings have" in str(error)
    fixed = await client.publish_turn(turn_event(cid, 3, [user("as a sub-agent")], MODEL, profile="subagent"))
    assert (await client.wait_for(fixed)).problems == ()  # the same seq, published again, stored

    asked = [{"turn_seq": 99}, {"turn_seq": 1, "index": 0}]
    pinning = await client.publish_turn(
        turn_event(cid, 4, [user("keep the first one")], MODEL, pin=asked, unpin=[{"turn_seq": 2}])
    )
    start = time.monotonic()
    result = await client.wait_for(pinning, timeout=USUAL_WAIT)
    assert time.monotonic() - start < USUAL_WAIT / 2
    assert result.turn_seq == 4
    assert len(result.problems) == 2, result.problems
    assert result.problems[0].startswith(f"pin of turn 99: {cid} has no turn 99")
    assert result.problems[1].startswith(f"unpin of turn 2: turn 2 of {cid} is not pinned")
    # What could be applied was: the wait applied the asks, as the next holder of the lock.
    entries = (await client.snapshot(cid)).history.entries
    assert [e.seq for e in entries if e.message.get("pinned")] == [1]
    assert (await client.meta(cid)).pins == ""


async def test_every_kind_of_refusal_is_answered_and_reported_once(running: Running) -> None:
    """A turn held behind a gap that never fills, and bytes the schema refuses, are answered too; a
    wait on the conversation raises the last turn's rejection once, then waits on what is stored."""
    client, cid = running.client, "refusals"
    await client.wait_for(await client.publish_turn(turn_event(cid, 1, [user("hello")], MODEL)))

    ahead = await client.publish_turn(turn_event(cid, 3, [user("turn 2 never comes")], MODEL))
    error = await rejected(client, ahead)
    assert (error.turn_seq, error.reason) == (3, "sequence_gap")
    assert "a turn before it never arrived" in str(error)

    bad = turn_bytes(cid, 2, [user("fine")], MODEL)
    data = json.loads(bad)
    data["messages"].append({"role": "tool", "content": "no call id"})
    raw = await client.publish_raw(json.dumps(data).encode(), cid.encode())
    assert raw is not None
    assert raw.fingerprint is None
    with pytest.raises(
        TurnRejected, match=r"turn 2 was rejected \(schema_violation\).*tool_call_id"
    ) as raised:
        await client.wait_for(cid, timeout=USUAL_WAIT)  # the conversation's wait raises the last turn's
    assert raised.value.reason == "schema_violation"
    assert await client.wait_for(cid, timeout=USUAL_WAIT) == 0  # reported once: the wait goes on
    assert await client.publish_raw(b"not json", cid.encode()) is None  # names nothing to answer for


async def test_next_turn_seq_never_hands_out_a_seq_this_client_published(running: Running) -> None:
    """The one safe pattern (docs/integration.md): seqs this client published, stored or not yet, are
    never drawn again; a compaction request with no seq draws its own."""
    client, cid = running.client, "counted"
    for seq in (1, 2, 3):  # the runtime's own count, published faster than the worker stores them
        await client.publish_turn(turn_event(cid, seq, [user(f"turn {seq}")], MODEL))
    drawn = await client.next_turn_seq(cid)
    assert drawn == 4
    await client.publish_turn(turn_event(cid, drawn, [user("a drawn seq is published")], MODEL))
    request = await client.request_compaction(cid, None, MODEL)
    assert request.turn_seq == 5
    result = await client.wait_for(request, timeout=USUAL_WAIT)
    assert (result.turn_seq, result.problems) == (5, ())
    assert (await client.meta(cid)).last_seq == 5
