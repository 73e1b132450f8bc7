"""Rewinding a committed compaction against real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio

from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionStarted,
    Outcome,
    Trigger,
)
from compaction_worker.contracts.history import public_message, render
from compaction_worker.errors import LockNotAcquiredError, RewindError
from compaction_worker.runtime.rewind import Rewinder
from compaction_worker.runtime.turns import TurnHandler
from compaction_worker.settings import Settings
from compaction_worker.state.lock import Locks
from compaction_worker.strategies import provider_problems
from tests.orchestration import Parts, Published, compact_now, conversation, rules_conversation
from tests.runtime.test_compactor import compact_mentions

pytestmark = pytest.mark.integration


class TestRewinder:
    @pytest.fixture
    def rewinder(self, parts: Parts) -> Rewinder:
        return parts.rewinder

    async def _until_scheduled(self, turns: TurnHandler, events: list[bytes]) -> int:
        """Hand turns in until one schedules a compaction; returns how many were handed in."""
        for i, event in enumerate(events, start=1):
            if (await turns.handle(event, b"c")).scheduled is not None:
                return i
        raise AssertionError("no turn crossed the threshold")

    async def test_undoing_the_second_compaction_gives_the_first_plus_later_turns(
        self, parts: Parts, rewinder: Rewinder, published: Published
    ) -> None:
        """Reference 004 (rewind): compact twice, rewind the second: the first's history plus every turn appended since."""
        events = conversation(80)
        handed = await self._until_scheduled(parts.turns, events)
        assert (await compact_now(parts.jobs, parts.compactor)).version == 1
        first = await parts.store.snapshot("c")
        handed += await self._until_scheduled(parts.turns, events[handed:])
        assert (await compact_now(parts.jobs, parts.compactor)).version == 2
        for event in events[handed : handed + 2]:  # appended after the second compaction
            await parts.turns.handle(event, b"c")
        handed += 2
        since = [r for r in await parts.store.transcript("c") if r["n"] > first.meta.msg_count]
        assert len(since) > 2

        rewound = await rewinder.rewind("c")

        after = await parts.store.snapshot("c")
        assert render(after.history) == render(first.history) + [public_message(r["m"]) for r in since]
        assert after.history.chunks == first.history.chunks
        assert after.meta.history_tokens == first.meta.history_tokens + sum(r["t"] for r in since)
        assert (after.meta.version, after.meta.last_seq) == (3, handed)
        assert provider_problems(render(after.history)) == []
        assert (rewound.rewound_version, rewound.completed.version) == (2, 3)
        started = CompactionStarted.model_validate(published.on("compaction.started")[-1])
        done = CompactionCompleted.model_validate(published.on("compaction.completed")[-1])
        assert (done.trigger, done.outcome, done.compaction_id) == (
            Trigger.REWIND,
            Outcome.REWOUND,
            started.compaction_id,
        )
        assert done.tokens_after == after.meta.total_tokens > done.tokens_before
        assert done.messages_after == len(render(after.history))

    async def test_a_rewind_clears_the_threshold_rule_s_marks(self, parts: Parts, rewinder: Rewinder) -> None:
        """The floor and the compacted turn belong to the history a commit left (invariant 14): the
        history a rewind restores has neither, and its next compaction finds its own."""
        for event in rules_conversation(1050, 4):
            await parts.turns.handle(event, b"c")
            while await parts.jobs.due(5):
                await compact_now(parts.jobs, parts.compactor)
        meta = await parts.store.meta("c")
        assert meta.floor_tokens > 0
        assert meta.compacted_seq == 4
        await rewinder.rewind("c")
        meta = await parts.store.meta("c")
        assert (meta.floor_tokens, meta.compacted_seq) == (0, 0)

    async def test_repeated_rewinds_walk_back_to_the_transcript(
        self, parts: Parts, rewinder: Rewinder
    ) -> None:
        """Undo, undo again: the whole transcript verbatim; a third undo has nothing left."""
        events = conversation(80)
        handed = await self._until_scheduled(parts.turns, events)
        await compact_now(parts.jobs, parts.compactor)
        handed += await self._until_scheduled(parts.turns, events[handed:])
        await compact_now(parts.jobs, parts.compactor)
        assert (await rewinder.rewind("c")).rewound_version == 2
        assert (await rewinder.rewind("c")).rewound_version == 1
        after = await parts.store.snapshot("c")
        transcript = await parts.store.transcript("c")
        assert after.history.chunks == ()
        assert [e.message for e in after.history.entries] == [r["m"] for r in transcript]
        assert after.meta.context_status.value == "full"
        with pytest.raises(RewindError, match="nothing to undo"):
            await rewinder.rewind("c")
        assert (await parts.store.meta("c")).version == 4

    async def test_busy_lock_refuses_and_changes_nothing(
        self, parts: Parts, rewinder: Rewinder, redis_client: redis.asyncio.Redis, published: Published
    ) -> None:
        """While a compaction holds the lock, a rewind is refused and publishes nothing."""
        await self._until_scheduled(parts.turns, conversation(80))
        await compact_now(parts.jobs, parts.compactor)
        before = len(published.events)
        assert await Locks(redis_client, 30).acquire("c", parts.store.keys("c")) is not None
        with pytest.raises(LockNotAcquiredError):
            await rewinder.rewind("c")
        assert (await parts.store.meta("c")).version == 1
        assert len(published.events) == before

    async def test_a_rewind_brings_the_dropped_artifacts_back(
        self, redis_client: redis.asyncio.Redis, settings: Settings, published: Published
    ) -> None:
        """Issue 9: compaction.completed counts the artifacts the history lacks; after a rewind it lacks none."""
        done, parts = await compact_mentions(redis_client, settings, published)
        assert done.artifacts_dropped > 0
        rewound = await parts.rewinder.rewind("a")
        assert rewound.completed.artifacts_dropped == 0
        assert (
            CompactionCompleted.model_validate(published.on("compaction.completed")[-1]).artifacts_dropped
            == 0
        )
