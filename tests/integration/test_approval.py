"""Approval mode keeps the window (docs/design.md, "Proposals"; invariants 5 and 14) through the real
broker and Redis: under ``pipeline.approval: manual``, with nobody approving, the stored history never
outgrows what its window leaves for input, and ``Client.proposal`` never shows one proposal's history
with another moment's counts."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_worker.budget.threshold import calibrated_total
from compaction_worker.contracts.events import CompactionCompleted, CompactionProposed, Outcome
from compaction_worker.runtime.compactor import AT_WINDOW_UNAPPROVED
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings, running_worker

from .helpers import read_topic

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
WINDOW = 4000
AVAILABLE = 3000
"""What the window leaves for input: gpt-4o-mini's output reserve is capped at a quarter of it."""
TURNS = 80


def _turn(cid: str, seq: int) -> Any:
    """Turn ``seq``: about 230 tokens of a user's or the assistant's words."""
    role = "user" if seq % 2 else "assistant"
    words = " ".join(f"{role}{seq}-word{i}" for i in range(50))
    text = f"turn {seq} of {cid}: the migration plan step {seq}; tests/test_m{seq}.py failed; {words}"
    return turn_event(cid, seq, [{"role": role, "content": text}], MODEL, context_window=WINDOW)


@dataclass(frozen=True)
class Seen:
    """What ``Client.proposal`` showed after one turn."""

    last_seq: int
    compaction_id: uuid.UUID
    tokens_before: int
    messages: list[dict[str, Any]]
    stale: bool
    turns_since: int


async def test_nobody_approves_and_the_history_stays_within_the_window(
    kafka_bootstrap: str, redis_url: str, fake_llm: FakeLLMServer
) -> None:
    """80 turns on a 4,000-token window, one at a time, nobody approving: after each the stored
    total stays under what the window leaves for input (3,000), no compaction ever started from a
    history past the window, and every commit says it did not wait; below the window, threshold runs
    keep proposing. ``Client.proposal`` shows each proposal exactly as proposed, its own messages with
    its own ``tokens_before``, and says when turns have moved the history past it."""
    topics = fresh_topics()
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm),
        pipeline={"approval": "manual"},
    )
    cid = f"unapproved-{uuid.uuid4().hex[:8]}"
    totals: list[int] = []
    seen: list[Seen] = []
    async with running_worker(settings) as (_, client):
        for seq in range(1, TURNS + 1):
            await client.publish_turn(_turn(cid, seq))
            await client.wait_for(cid, timeout=60)
            meta = await client.meta(cid)
            assert meta.last_seq == seq
            totals.append(calibrated_total(meta))
            shown = await client.proposal(cid)
            if shown is not None:
                assert shown.compaction_id is not None
                seen.append(
                    Seen(
                        seq,
                        shown.compaction_id,
                        shown.tokens_before,
                        shown.messages,
                        shown.stale,
                        shown.turns_since,
                    )
                )
        assert (await client.meta(cid)).window == WINDOW
        proposed = {
            e.compaction_id: e
            for e in map(
                CompactionProposed.model_validate_json, await read_topic(settings, settings.topics.proposed)
            )
            if e.conversation_id == cid
        }
        completed = [
            c
            for c in map(
                CompactionCompleted.model_validate_json, await read_topic(settings, settings.topics.completed)
            )
            if c.conversation_id == cid
        ]

    compacted = [c for c in completed if c.outcome is Outcome.COMPACTED]
    print(f"stored total after each turn (window {WINDOW}, available {AVAILABLE}): {totals}")
    print(f"tokens before each commit: {[c.tokens_before for c in compacted]}")
    assert max(totals) < AVAILABLE, totals
    assert len(compacted) >= 2, [(c.outcome, c.error) for c in completed]
    # Nobody approved: each commit is one the window forced, and says so; none started past the window.
    assert all(AT_WINDOW_UNAPPROVED in c.notes for c in compacted), [c.notes for c in compacted]
    assert all(AVAILABLE <= c.tokens_before <= WINDOW for c in compacted), [
        c.tokens_before for c in compacted
    ]
    assert all(c.tokens_after <= c.target for c in compacted)
    # Below the window, threshold runs proposed; the commits ended the proposals they made moot.
    assert len(proposed) >= 2
    discarded = [c for c in completed if c.outcome is Outcome.DISCARDED]
    assert {c.compaction_id for c in discarded} <= set(proposed)
    assert any("reached what its window leaves for input" in (c.error or "") for c in discarded), [
        c.error for c in discarded
    ]

    # Each proposal as proposed: its own tokens_before and messages, however many turns followed it.
    assert seen
    first: dict[uuid.UUID, Seen] = {}
    for s in seen:
        event = proposed[s.compaction_id]
        assert s.tokens_before == event.tokens_before, (s.last_seq, s.tokens_before, event.tokens_before)
        assert (s.stale, s.turns_since) == (s.last_seq != event.last_seq, s.last_seq - event.last_seq)
        earlier = first.setdefault(s.compaction_id, s)
        assert not earlier.stale, "a proposal is first seen right after the turn it was computed on"
        assert earlier.tokens_before == totals[earlier.last_seq - 1]
        assert s.messages == earlier.messages
    assert any(s.stale for s in seen), "no turn ever arrived while a proposal waited"
