"""Tests for a compaction computed and not applied (compaction_worker.runtime.preview), through a real Redis."""

from __future__ import annotations

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.contracts.history import render
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, all_keys, conversation, user

pytestmark = pytest.mark.integration


async def compact_now(parts: Parts, cid: str) -> CompactionCompleted:
    await parts.jobs.schedule(cid, Trigger.MANUAL)
    completed = await run_job(parts.jobs, parts.compactor, cid)
    assert completed is not None
    return completed


async def state(parts: Parts) -> dict[str, object]:
    """Every key's type and value (what a write would change)."""
    redis = parts.store.redis
    found: dict[str, object] = {}
    for key in sorted(str(k) for k in await all_keys(redis)):
        kind = await redis.type(key)
        found[key] = (kind, await redis.dump(key))
    return found


async def test_a_preview_is_what_the_compaction_then_commits_byte_for_byte(
    parts: Parts, settings: Settings, published: Published
) -> None:
    """Issue 37: with nothing changed in between, the history a preview shows is the one a manual
    compaction commits, for a first compaction and for one of an already compacted history."""
    client = Client(settings, parts.store, None)
    for event in conversation(24):
        await parts.turns.handle(event, b"c")

    for round_ in range(2):
        shown = await client.preview_compaction("c")
        done = await compact_now(parts, "c")
        history = (await parts.store.snapshot("c")).history

        assert shown.outcome is done.outcome is Outcome.COMPACTED
        assert shown.messages == render(history, settings.pipeline.summary_placement)
        assert (shown.tokens_before, shown.tokens_after, list(shown.stages)) == (
            done.tokens_before,
            done.tokens_after,
            done.stages,
        )
        assert shown.standing == done.standing_state
        assert shown.replaced > 0
        for seq in range(25 + 12 * round_, 37 + 12 * round_):  # more turns: something to compact again
            await parts.turns.handle(turn_bytes("c", seq, [user(f"question {seq}: " + "detail " * 60)]), b"c")


async def test_a_preview_writes_nothing_and_publishes_nothing(
    parts: Parts, settings: Settings, published: Published
) -> None:
    for event in conversation(24):
        await parts.turns.handle(event, b"c")
    before, sent = await state(parts), len(published.events)

    shown = await Client(settings, parts.store, None).preview_compaction("c", instructions="keep the numbers")

    assert shown.outcome is Outcome.COMPACTED
    assert shown.version == 0
    assert await state(parts) == before
    assert len(published.events) == sent


async def test_a_history_that_cannot_shrink_previews_as_a_noop(parts: Parts, settings: Settings) -> None:
    await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"c")

    shown = await Client(settings, parts.store, None).preview_compaction("c")

    assert (shown.outcome, shown.replaced, shown.stages) == (Outcome.NOOP, 0, ())
    assert shown.tokens_after == shown.tokens_before
    assert shown.error
