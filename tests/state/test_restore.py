"""Rewind: the history from before a compaction comes back from the transcript, as a new version."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.contracts.events import ContextStatus
from compaction_worker.contracts.history import SummaryChunk
from compaction_worker.conversation.apply import NewMessage
from compaction_worker.errors import RewindError, StaleFenceError
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.restore import RewindResult, rewind, rewind_target, versions
from compaction_worker.state.store import Store
from tests.state.helpers import append, chunk, msg

pytestmark = pytest.mark.integration


OVERHEAD = 3
"""What the summary turn costs beyond its chunks, in these tests."""


def undo(
    store: Store, lease: Lease, version: int | None = None, overhead: int = OVERHEAD
) -> Awaitable[RewindResult]:
    """Rewind conversation "c" under ``lease``: compaction ``version`` (default: the latest in effect)."""
    return rewind(store, "c", fence=lease.fence, lock_token=lease.token, version=version, overhead=overhead)


class TestRewind:
    async def _compacted(self, store: Store, locks: Locks) -> Lease:
        """Three turns, then a compaction: a chunk over turn 1 and a pruned tool output in turn 2."""
        call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        await append(store, "c", 1, msg("q1", tokens=7), msg("a1", "assistant", tokens=5))
        await append(
            store,
            "c",
            2,
            msg("q2", tokens=6),
            NewMessage({"role": "assistant", "content": None, "tool_calls": [call]}, 9),
            NewMessage({"role": "tool", "tool_call_id": "c1", "content": "x" * 400}, 100),
        )
        lease = await locks.acquire("c", store.keys("c"))
        assert isinstance(lease, Lease)
        snapshot = await store.snapshot("c")
        entries = snapshot.history.entries
        pruned = replace(
            entries[4], message={**entries[4].message, "content": "[cleared]"}, tokens=4, edit="pruned"
        )
        kept = (*entries[2:4], pruned)
        await store.commit(
            "c",
            fence=lease.fence,
            lock_token=lease.token,
            expected_version=0,
            consumed=len(entries),
            chunks=[chunk(entries[0], entries[1], tokens=5)],
            entries=kept,
            tokens=(5 + OVERHEAD + 6 + 9 + 4) - 127,
            status=ContextStatus.SUMMARIZED,
            record={"version": 1, "trigger": "threshold", "chunks_before": []},
        )
        await locks.release(lease, store.keys("c"))
        await append(store, "c", 3, msg("q3", tokens=8))
        lease = await locks.acquire("c", store.keys("c"))
        assert isinstance(lease, Lease)
        return lease

    async def test_restores_verbatim_messages_and_keeps_later_appends(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """References 000 and 003 (originals preserved) and 004 (rewind): undoing the only compaction gives back every transcript message as appended, edits undone."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        result = await undo(store, lease)
        assert (result.version, result.rewound, result.context_status) == (2, 1, ContextStatus.FULL)
        after = await store.snapshot("c")
        transcript = await store.transcript("c")
        assert after.history.chunks == ()
        assert [e.message for e in after.history.entries] == [r["m"] for r in transcript]
        assert [e.n for e in after.history.entries] == [1, 2, 3, 4, 5, 6]
        assert after.history.entries[4].message["content"] == "x" * 400
        assert all(e.edit is None for e in after.history.entries)
        assert (after.meta.version, after.meta.context_status) == (2, ContextStatus.FULL)
        log = await store.compactions("c")
        assert [(r["version"], r["trigger"]) for r in log] == [(1, "threshold"), (2, "rewind")]
        assert log[-1]["rewound_version"] == 1
        assert [SummaryChunk.from_json(c).id for c in log[-1]["chunks_before"]] == ["c1"]

    async def test_recomputes_tokens_from_the_transcript(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """The total is the stored counts of the restored messages, whatever the total said before."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        await store.set_meta("c", history_tokens=999_999)  # a drifted total is repaired too
        result = await undo(store, lease, version=1)
        assert result.history_tokens == 7 + 5 + 6 + 9 + 100 + 8
        assert (await store.meta("c")).history_tokens == 135

    async def test_restores_the_chunks_from_before_a_later_compaction(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Undoing a second compaction keeps the first one's chunks and counts their overhead."""
        locks = Locks(redis_client, 30)
        lease = await self._compacted(store, locks)
        snapshot = await store.snapshot("c")
        first = snapshot.history.chunks[0]
        wider = replace(first, id="c2", last_n=6, last_seq=3, tokens=6)
        await store.commit(
            "c",
            fence=lease.fence,
            lock_token=lease.token,
            expected_version=1,
            consumed=snapshot.entry_count,
            chunks=[wider],
            entries=[],
            tokens=-snapshot.meta.history_tokens + 6 + OVERHEAD,
            status=ContextStatus.SUMMARIZED,
            record={"version": 2, "trigger": "manual", "chunks_before": [first.to_json()]},
        )
        result = await undo(store, lease)
        assert result.rewound == 2
        after = await store.snapshot("c")
        assert [c.id for c in after.history.chunks] == ["c1"]
        assert [e.n for e in after.history.entries] == [3, 4, 5, 6]
        assert after.history.entries[2].message["content"] == "x" * 400  # the prune is undone too
        assert after.meta.history_tokens == 5 + OVERHEAD + 6 + 9 + 100 + 8
        assert after.meta.context_status is ContextStatus.SUMMARIZED

    async def test_messages_appended_during_the_rewind_survive(
        self, store: Store, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A turn appended between the rewind's read and its commit stays, and is counted (docs/design.md, invariant 1)."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        script = store._replace

        async def append_first(keys: Sequence[str], lists: Any, **header: Any) -> Any:
            await append(store, "c", 4, msg("late", "assistant", tokens=11))
            return await script(keys, lists, **header)

        monkeypatch.setattr(store, "_replace", append_first)
        result = await undo(store, lease)
        assert result.appended_during == 1
        after = await store.snapshot("c")
        assert [e.n for e in after.history.entries] == [1, 2, 3, 4, 5, 6, 7]
        assert after.history.entries[-1].message["content"] == "late"
        assert after.meta.history_tokens == 135 + 11

    async def test_stale_fence_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A rewinder whose lock expired and was taken over writes nothing (docs/design.md, invariant 3)."""
        first = await self._compacted(store, Locks(redis_client, 30))
        await Locks(redis_client, 30).release(first, store.keys("c"))
        locks = Locks(redis_client, 0.2)
        lease = await locks.acquire("c", store.keys("c"))
        assert isinstance(lease, Lease)
        before = await store.snapshot("c")
        await asyncio.sleep(0.3)
        assert await locks.acquire("c", store.keys("c")) is not None  # another worker takes over
        with pytest.raises(StaleFenceError, match="stale_fence"):
            await undo(store, lease, overhead=0)
        after = await store.snapshot("c")
        assert (after.meta, after.history) == (before.meta, before.history)
        assert len(await store.compactions("c")) == 1

    async def test_nothing_to_undo_and_unknown_versions_are_refused(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Without a compaction, or with a version the log lacks, the rewind says so and writes nothing."""
        await append(store, "c", 1, msg("q1"))
        lease = await Locks(redis_client, 30).acquire("c", store.keys("c"))
        assert isinstance(lease, Lease)
        with pytest.raises(RewindError, match="nothing to undo"):
            await undo(store, lease, overhead=0)
        with pytest.raises(RewindError, match="no compaction version 3"):
            await undo(store, lease, version=3, overhead=0)
        assert (await store.meta("c")).version == 0


def record(version: int, rewound: int | None = None) -> dict[str, Any]:
    if rewound is None:
        return {"version": version, "trigger": "threshold", "chunks_before": []}
    return {"version": version, "trigger": "rewind", "rewound_version": rewound, "chunks_before": []}


class TestRewindTarget:
    def test_default_is_the_latest_compaction(self) -> None:
        """With no version, the newest compaction is undone."""
        assert rewind_target([record(1), record(2)], None)["version"] == 2

    def test_repeated_default_rewinds_walk_back(self) -> None:
        """After undoing version 2, the next default rewind undoes version 1, then nothing is left."""
        log = [record(1), record(2), record(3, rewound=2)]
        assert rewind_target(log, None)["version"] == 1
        with pytest.raises(RewindError, match="nothing to undo"):
            rewind_target([*log, record(4, rewound=1)], None)

    def test_restoring_a_later_state_brings_its_compactions_back(self) -> None:
        """Rewinding to before version 3 after undoing 1 puts 1 and 2 back in effect."""
        log = [record(1), record(2), record(3), record(4, rewound=1), record(5, rewound=3)]
        assert rewind_target(log, None)["version"] == 2

    def test_a_rewind_record_is_not_a_target(self) -> None:
        """Naming a rewind's version is refused with what to do instead."""
        with pytest.raises(RewindError, match="version 2 is a rewind"):
            rewind_target([record(1), record(2, rewound=1)], 2)

    def test_unknown_version_lists_the_compactions(self) -> None:
        """A version the log lacks is refused, naming the versions there are."""
        with pytest.raises(RewindError, match=r"no compaction version 9 \(compactions: 1, 2\)"):
            rewind_target([record(1), record(2)], 9)


def test_versions_say_what_each_compaction_replaced_and_which_are_in_effect() -> None:
    """The log as a runtime reads it: after "1, 2, 3, undo 1, undo 3", 1 and 2 are back in effect."""
    log = [
        {**record(1), "at": 10.0, "tokens_before": 900, "tokens_after": 300, "covered_through_n": 12},
        record(2),
        record(3),
        record(4, rewound=1),
        record(5, rewound=3),
    ]
    listed = versions(log)
    assert [(v.version, v.trigger, v.in_effect, v.rewound_version) for v in listed] == [
        (1, "threshold", True, None),
        (2, "threshold", True, None),
        (3, "threshold", False, None),
        (4, "rewind", False, 1),
        (5, "rewind", False, 3),
    ]
    assert (listed[0].at, listed[0].tokens_before, listed[0].tokens_after, listed[0].replaced_through_n) == (
        10.0,
        900,
        300,
        12,
    )
