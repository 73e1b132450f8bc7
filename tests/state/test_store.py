"""The Redis store: idempotent appends, incremental totals, the fenced commit and the rewind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.contracts.events import ContextStatus, Trigger
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.errors import RewindError, StaleFenceError
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.store import (
    AppendStatus,
    HeldTurn,
    JobRequest,
    NewMessage,
    Store,
    held_value,
    parse_held,
    rewind_target,
)

pytestmark = pytest.mark.integration


def msg(text: str, role: str = "user", tokens: int = 10) -> NewMessage:
    return NewMessage({"role": role, "content": text}, tokens)


@pytest.fixture
def store(redis_client: redis.asyncio.Redis) -> Store:
    return Store(redis_client, "t", retention_seconds=3600)


async def append(
    store: Store, cid: str, seq: int, *messages: NewMessage, fingerprint: str | None = None
) -> str:
    meta = await store.meta(cid)
    status, _, _ = await store.append_turn(
        cid, seq, list(messages), {"model": "gpt-4o"}, expected_count=meta.msg_count, fingerprint=fingerprint
    )
    return status


FP_A, FP_B = "a" * 32, "0123456789abcdef" * 2


def chunk(first: Entry, last: Entry, text: str = "summary", tokens: int = 5) -> SummaryChunk:
    return SummaryChunk(
        id="c1",
        text=text,
        first_seq=first.seq,
        last_seq=last.seq,
        first_n=first.n,
        last_n=last.n,
        tokens=tokens,
        created_at="2026-01-01T00:00:00+00:00",
        model="test",
    )


class TestAppend:
    async def test_appends_in_order_and_counts_tokens(self, store: Store) -> None:
        """Appends assign ordinals and keep the running token total without re-reading."""
        assert await append(store, "c", 1, msg("a", tokens=7), msg("b", "assistant", tokens=5)) == "appended"
        assert await append(store, "c", 2, msg("c", tokens=3)) == "appended"
        meta = await store.meta("c")
        assert (meta.last_seq, meta.msg_count, meta.history_tokens) == (2, 3, 15)
        snapshot = await store.snapshot("c")
        assert [e.n for e in snapshot.history.entries] == [1, 2, 3]
        assert [e.seq for e in snapshot.history.entries] == [1, 1, 2]
        assert [r["m"]["content"] for r in await store.transcript("c")] == ["a", "b", "c"]

    async def test_originals_by_ordinal(self, store: Store) -> None:
        """The transcript's messages by ordinal, in one round trip; unknown ordinals are absent."""
        await append(store, "c", 1, msg("a"), msg("b", "assistant"))
        await append(store, "c", 2, msg("c"))
        found = await store.originals("c", [3, 1, 9])
        assert found == {1: {"role": "user", "content": "a"}, 3: {"role": "user", "content": "c"}}
        assert await store.originals("c", []) == {}

    async def test_duplicate_changes_nothing(self, store: Store) -> None:
        """A turn at or below the last seq is a no-op (invariant 2)."""
        await append(store, "c", 1, msg("a"))
        before = await store.redis.lrange(store.keys("c").transcript, 0, -1)
        assert await append(store, "c", 1, msg("a")) == "duplicate"
        assert await store.redis.lrange(store.keys("c").transcript, 0, -1) == before
        assert (await store.meta("c")).history_tokens == 10

    async def test_gap_is_refused(self, store: Store) -> None:
        """A turn that skips a seq is not appended."""
        await append(store, "c", 1, msg("a"))
        assert await append(store, "c", 3, msg("c")) == "gap"
        assert (await store.meta("c")).last_seq == 1

    async def test_concurrent_writer_conflict(self, store: Store) -> None:
        """A writer whose message count is stale is refused, so ordinals never collide."""
        await append(store, "c", 1, msg("a"))
        status, _, _ = await store.append_turn("c", 2, [msg("b")], {}, expected_count=0)
        assert status == "conflict"
        assert (await store.meta("c")).msg_count == 1

    async def test_thousands_of_messages_in_one_turn(self, store: Store) -> None:
        """Lists longer than Lua's unpack limit are pushed in batches."""
        many = [msg(f"m{i}", tokens=1) for i in range(3000)]
        assert await append(store, "c", 1, *many) == "appended"
        assert await store.redis.llen(store.keys("c").entries) == 3000
        assert (await store.meta("c")).history_tokens == 3000

    async def test_retention_sets_ttls(self, store: Store) -> None:
        """Every key of an active conversation carries the retention TTL, the fingerprints too."""
        await append(store, "c", 1, msg("a"), fingerprint=FP_A)
        for key in (store.keys("c").transcript, store.keys("c").fingerprints):
            ttl = await store.redis.pttl(key)
            assert 3_500_000 < ttl <= 3_600_000, key

    async def test_every_turn_refreshes_the_artifact_archive(self, store: Store) -> None:
        """The archive, written only at compactions, lives as long as the conversation takes turns."""
        await append(store, "c", 1, msg("a"))
        await store.redis.hset(store.keys("c").artifacts, "path:/src/a.py", "1")
        await store.redis.pexpire(store.keys("c").artifacts, 1_000)
        await append(store, "c", 2, msg("b"))
        assert 3_500_000 < await store.redis.pttl(store.keys("c").artifacts) <= 3_600_000

    async def test_request_is_recorded_with_the_turn(self, store: Store) -> None:
        """A compaction request rides in the append script, so it cannot be lost alone."""
        meta = await store.meta("c")
        await store.append_turn(
            "c",
            1,
            [msg("a")],
            {},
            expected_count=meta.msg_count,
            request=JobRequest(Trigger.REACTIVE, "too long", estimate=1234),
        )
        job = await store.job("c")
        assert job is not None
        assert (job.trigger, job.error, job.estimate) == (Trigger.REACTIVE, "too long", 1234)

    async def test_weaker_request_does_not_replace_stronger(self, store: Store) -> None:
        """A threshold request leaves a pending manual request in place."""
        assert await store.set_job("c", Trigger.MANUAL)
        assert not await store.set_job("c", Trigger.THRESHOLD)
        assert await store.set_job("c", Trigger.REACTIVE, "x")
        job = await store.job("c")
        assert job is not None
        assert job.trigger is Trigger.REACTIVE


class TestFingerprints:
    async def test_same_fingerprint_is_a_duplicate_another_is_a_conflict(self, store: Store) -> None:
        """A stored seq with the same fingerprint is a duplicate; with another, a conflicting duplicate; nothing moves."""
        assert await append(store, "c", 1, msg("a"), fingerprint=FP_A) == AppendStatus.APPENDED
        assert await store.fingerprint("c", 1) == FP_A
        keys = store.keys("c")
        before = [await store.redis.dump(k) for k in keys.all()]
        assert await append(store, "c", 1, msg("a"), fingerprint=FP_A) == AppendStatus.DUPLICATE
        assert await append(store, "c", 1, msg("b"), fingerprint=FP_B) == AppendStatus.CONFLICTING_DUPLICATE
        assert [await store.redis.dump(k) for k in keys.all()] == before
        assert await store.fingerprint("c", 1) == FP_A
        assert await store.fingerprint("c", 2) is None

    async def test_a_turn_stored_without_a_fingerprint_takes_any_redelivery_as_a_duplicate(
        self, store: Store
    ) -> None:
        """Conversations stored before fingerprints were kept keep working: their seqs have none to compare."""
        await append(store, "c", 1, msg("a"))
        assert await store.fingerprint("c", 1) is None
        assert await append(store, "c", 1, msg("b"), fingerprint=FP_B) == AppendStatus.DUPLICATE
        assert [r["m"]["content"] for r in await store.transcript("c")] == ["a"]
        assert await append(store, "c", 2, msg("c"), fingerprint=FP_B) == AppendStatus.APPENDED

    async def test_a_different_turn_for_a_held_seq_is_refused_and_the_held_one_kept(
        self, store: Store
    ) -> None:
        """The turn held behind a gap came first: another turn with its seq is refused, the held one applies."""
        await append(store, "c", 1, msg("a"), fingerprint=FP_B)
        assert await store.buffer_pending("c", 2, b'{"held": 1}', fingerprint=FP_A)
        assert await append(store, "c", 2, msg("other"), fingerprint=FP_B) == AppendStatus.CONFLICTING_HELD
        assert (await store.meta("c")).last_seq == 1
        assert await store.pending_turn("c", 2) == b'{"held": 1}'
        assert await append(store, "c", 2, msg("held"), fingerprint=FP_A) == AppendStatus.APPENDED
        assert await store.pending_seqs("c") == []
        assert await store.fingerprint("c", 2) == FP_A

    async def test_a_held_turn_without_a_fingerprint_conflicts_with_nothing(self, store: Store) -> None:
        """A turn held before fingerprints were kept is replaced as before; a leased one keeps its fingerprint."""
        await append(store, "c", 1, msg("a"))
        await store.redis.hset(
            store.keys("c").pending, mapping={"2": b'12:{"old": 1}', "3": b'12/99:{"x": 3}'}
        )
        assert await append(store, "c", 2, msg("b"), fingerprint=FP_B) == AppendStatus.APPENDED
        await store.redis.hset(store.keys("c").pending, "3", b"12/99:" + FP_A.encode() + b':{"x": 3}')
        assert await append(store, "c", 3, msg("c"), fingerprint=FP_B) == AppendStatus.CONFLICTING_HELD

    def test_held_form_carries_the_fingerprint(self) -> None:
        """The fingerprint follows the hold time; values without it still read; a malformed one is refused."""
        body = b'  {"x": "ab:cd"}'
        assert parse_held(2, held_value(body, 5, FP_A)) == HeldTurn(2, 5, body, fingerprint=FP_A)
        assert parse_held(2, b"5/7:" + FP_B.encode() + b":" + body) == HeldTurn(2, 5, body, 7, FP_B)
        assert parse_held(2, held_value(body, 5)) == HeldTurn(2, 5, body)
        with pytest.raises(ValueError, match="fingerprint"):
            held_value(body, 5, "not-hex")


class TestCommit:
    async def _setup(self, store: Store, locks: Locks) -> tuple[int, str]:
        await append(store, "c", 1, msg("q1"), msg("a1", "assistant"))
        await append(store, "c", 2, msg("q2"), msg("a2", "assistant"))
        lease = await locks.acquire("c", store.keys("c"))
        assert lease is not None
        return lease.fence, lease.token

    async def test_commit_keeps_messages_appended_meanwhile(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Reference 000 (history and originals stay in sync): entries appended after the snapshot survive the commit (invariant 1)."""
        locks = Locks(redis_client, 30)
        fence, token = await self._setup(store, locks)
        snapshot = await store.snapshot("c")
        entries = snapshot.history.entries
        await append(store, "c", 3, msg("q3"), msg("a3", "assistant"))  # during the "LLM call"
        result = await store.commit(
            "c",
            fence=fence,
            lock_token=token,
            expected_version=0,
            consumed=len(entries),
            chunks=[chunk(entries[0], entries[1])],
            entries=entries[2:],
            token_delta=5 - 20,
            status=ContextStatus.SUMMARIZED,
            record={"v": 1},
        )
        assert (result.version, result.appended_during) == (1, 2)
        after = await store.snapshot("c")
        assert [e.message["content"] for e in after.history.entries] == ["q2", "a2", "q3", "a3"]
        assert [c.id for c in after.history.chunks] == ["c1"]
        assert after.meta.history_tokens == 60 - 15
        assert after.meta.context_status is ContextStatus.SUMMARIZED
        assert len(await store.transcript("c")) == 6  # the transcript is never rewritten

    async def test_stale_fence_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A writer whose lock expired and was taken over cannot commit (invariant 3)."""
        locks = Locks(redis_client, 0.2)
        fence, token = await self._setup(store, locks)
        snapshot = await store.snapshot("c")
        await asyncio.sleep(0.3)
        assert await locks.acquire("c", store.keys("c")) is not None  # another worker takes over
        with pytest.raises(StaleFenceError, match="stale_fence"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=0,
                consumed=4,
                chunks=[],
                entries=snapshot.history.entries[2:],
                token_delta=-20,
                status=ContextStatus.FULL,
                record={},
            )
        assert (await store.snapshot("c")).history.entries == snapshot.history.entries

    async def test_expired_lock_is_refused_even_without_a_new_holder(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """The commit checks the lock itself, not only the fence."""
        locks = Locks(redis_client, 0.2)
        fence, token = await self._setup(store, locks)
        await asyncio.sleep(0.3)
        with pytest.raises(StaleFenceError, match="lock_lost"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=0,
                consumed=4,
                chunks=[],
                entries=[],
                token_delta=-40,
                status=ContextStatus.FULL,
                record={},
            )
        assert (await store.meta("c")).history_tokens == 40

    async def test_version_mismatch_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A commit based on an old version of the effective history is refused."""
        locks = Locks(redis_client, 30)
        fence, token = await self._setup(store, locks)
        with pytest.raises(StaleFenceError, match="stale_version"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=7,
                consumed=4,
                chunks=[],
                entries=[],
                token_delta=0,
                status=ContextStatus.FULL,
                record={},
            )


OVERHEAD = 3
"""What the summary turn costs beyond its chunks, in these tests."""


def never_count(message: Mapping[str, Any]) -> int:
    raise AssertionError(f"recounted {message}: the transcript stores its counts")


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
        assert lease is not None
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
            token_delta=(5 + OVERHEAD + 6 + 9 + 4) - 127,
            status=ContextStatus.SUMMARIZED,
            record={"version": 1, "trigger": "threshold", "chunks_before": []},
        )
        await locks.release(lease, store.keys("c"))
        await append(store, "c", 3, msg("q3", tokens=8))
        lease = await locks.acquire("c", store.keys("c"))
        assert lease is not None
        return lease

    async def test_restores_verbatim_messages_and_keeps_later_appends(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """References 000 and 003 (originals preserved) and 004 (rewind): undoing the only compaction gives back every transcript message as appended, edits undone."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        result = await store.rewind(
            "c", fence=lease.fence, lock_token=lease.token, version=None, count=never_count, overhead=OVERHEAD
        )
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
        result = await store.rewind(
            "c", fence=lease.fence, lock_token=lease.token, version=1, count=never_count, overhead=OVERHEAD
        )
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
            token_delta=-snapshot.meta.history_tokens + 6 + OVERHEAD,
            status=ContextStatus.SUMMARIZED,
            record={"version": 2, "trigger": "manual", "chunks_before": [first.to_json()]},
        )
        result = await store.rewind(
            "c", fence=lease.fence, lock_token=lease.token, version=None, count=never_count, overhead=OVERHEAD
        )
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
        """A turn appended between the rewind's read and its commit stays, and is counted (invariant 1)."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        script = store._rewind

        async def append_first(**kwargs: Any) -> Any:
            await append(store, "c", 4, msg("late", "assistant", tokens=11))
            return await script(**kwargs)

        monkeypatch.setattr(store, "_rewind", append_first)
        result = await store.rewind(
            "c", fence=lease.fence, lock_token=lease.token, version=None, count=never_count, overhead=OVERHEAD
        )
        assert result.appended_during == 1
        after = await store.snapshot("c")
        assert [e.n for e in after.history.entries] == [1, 2, 3, 4, 5, 6, 7]
        assert after.history.entries[-1].message["content"] == "late"
        assert after.meta.history_tokens == 135 + 11

    async def test_records_without_counts_are_counted_again(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Transcript records from before counts were stored are recounted with the given counter."""
        lease = await self._compacted(store, Locks(redis_client, 30))
        key = store.keys("c").transcript
        for i, raw in enumerate(await redis_client.lrange(key, 0, -1)):
            record = json.loads(raw)
            del record["t"]
            await redis_client.lset(key, i, json.dumps(record))
        result = await store.rewind(
            "c",
            fence=lease.fence,
            lock_token=lease.token,
            version=None,
            count=lambda _m: 2,
            overhead=OVERHEAD,
        )
        assert result.history_tokens == 6 * 2

    async def test_stale_fence_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A rewinder whose lock expired and was taken over writes nothing (invariant 3)."""
        first = await self._compacted(store, Locks(redis_client, 30))
        await Locks(redis_client, 30).release(first, store.keys("c"))
        locks = Locks(redis_client, 0.2)
        lease = await locks.acquire("c", store.keys("c"))
        assert lease is not None
        before = await store.snapshot("c")
        await asyncio.sleep(0.3)
        assert await locks.acquire("c", store.keys("c")) is not None  # another worker takes over
        with pytest.raises(StaleFenceError, match="stale_fence"):
            await store.rewind(
                "c", fence=lease.fence, lock_token=lease.token, version=None, count=never_count, overhead=0
            )
        after = await store.snapshot("c")
        assert (after.meta, after.history) == (before.meta, before.history)
        assert len(await store.compactions("c")) == 1

    async def test_nothing_to_undo_and_unknown_versions_are_refused(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Without a compaction, or with a version the log lacks, the rewind says so and writes nothing."""
        await append(store, "c", 1, msg("q1"))
        lease = await Locks(redis_client, 30).acquire("c", store.keys("c"))
        assert lease is not None
        with pytest.raises(RewindError, match="nothing to undo"):
            await store.rewind(
                "c", fence=lease.fence, lock_token=lease.token, version=None, count=never_count, overhead=0
            )
        with pytest.raises(RewindError, match="no compaction version 3"):
            await store.rewind(
                "c", fence=lease.fence, lock_token=lease.token, version=3, count=never_count, overhead=0
            )
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
