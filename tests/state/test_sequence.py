"""The turn-seq counter: distinct, consecutive seqs under concurrent callers, seeded from the stored turns."""

from __future__ import annotations

import asyncio

from compaction_worker.state.store import Store


class TestTurnSequence:
    async def test_concurrent_callers_get_distinct_consecutive_seqs(self, store: Store) -> None:
        """50 gathered calls get 1..50, each once."""
        seqs = await asyncio.gather(*(store.next_turn_seq("c") for _ in range(50)))
        assert sorted(seqs) == list(range(1, 51))

    async def test_starts_after_the_stored_turns(self, store: Store) -> None:
        """A conversation whose turns carried their own seqs continues after the last stored one."""
        await store.redis.hset(store.keys("c").meta, "last_seq", "7")
        assert [await store.next_turn_seq("c"), await store.next_turn_seq("c")] == [8, 9]
        await store.redis.hset(store.keys("c").meta, "last_seq", "20")
        assert await store.next_turn_seq("c") == 21

    async def test_the_counter_is_a_conversation_key_with_the_retention(self, store: Store) -> None:
        """It expires with the conversation and is deleted with it."""
        await store.next_turn_seq("c")
        key = store.keys("c").seq
        assert key in store.keys("c").all()
        assert key.startswith("t:{c}:")
        assert 3500 < await store.redis.ttl(key) <= 3600
        await store.delete("c")
        assert not await store.redis.exists(key)
