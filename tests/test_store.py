"""The Redis store: idempotent appends, incremental totals, and the fenced commit."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from compaction_worker.errors import StaleFenceError
from compaction_worker.events import ContextStatus, Trigger
from compaction_worker.history import Entry, SummaryChunk
from compaction_worker.lock import Locks
from compaction_worker.store import NewMessage, Store

pytestmark = pytest.mark.integration


def msg(text: str, role: str = "user", tokens: int = 10) -> NewMessage:
    return NewMessage({"role": role, "content": text}, tokens)


@pytest.fixture
def store(redis_client: redis.asyncio.Redis) -> Store:
    return Store(redis_client, "t", retention_seconds=3600)


async def append(store: Store, cid: str, seq: int, *messages: NewMessage) -> str:
    meta = await store.meta(cid)
    status, _, _ = await store.append_turn(
        cid, seq, list(messages), {"model": "gpt-4o"}, expected_count=meta.msg_count
    )
    return status


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
        """Every key of an active conversation carries the retention TTL."""
        await append(store, "c", 1, msg("a"))
        ttl = await store.redis.pttl(store.keys("c").transcript)
        assert 3_500_000 < ttl <= 3_600_000

    async def test_request_is_recorded_with_the_turn(self, store: Store) -> None:
        """A compaction request rides in the append script, so it cannot be lost alone."""
        meta = await store.meta("c")
        await store.append_turn(
            "c", 1, [msg("a")], {}, expected_count=meta.msg_count, request=(Trigger.REACTIVE, "too long")
        )
        job = await store.job("c")
        assert job is not None
        assert (job.trigger, job.error) == (Trigger.REACTIVE, "too long")

    async def test_weaker_request_does_not_replace_stronger(self, store: Store) -> None:
        """A threshold request leaves a pending manual request in place."""
        assert await store.set_job("c", Trigger.MANUAL)
        assert not await store.set_job("c", Trigger.THRESHOLD)
        assert await store.set_job("c", Trigger.REACTIVE, "x")
        job = await store.job("c")
        assert job is not None
        assert job.trigger is Trigger.REACTIVE


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
        """Entries appended after the snapshot survive the commit (invariant 1)."""
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
