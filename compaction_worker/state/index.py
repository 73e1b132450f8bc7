"""The shared indexes (jobs, held turns, outbox), sharded into buckets, and their leases.

Each index is a sorted set of conversation ids scored by when to look at them next (epoch
ms), split into ``redis.index_shards`` buckets by a stable hash of the id: each bucket is
its own key under its own hash tag, so on a Redis Cluster the buckets spread over the
slots (and primaries) instead of one shard taking every worker's index traffic. A bucket
lives outside the conversations' slots, so it is never written in the same script as a
conversation's keys; its owners order their writes instead (docs/design.md).

The single key a version before the buckets used (the index's base name) is still read by
the sweep: :meth:`ShardedIndex.due` moves what it finds there into the buckets, so
entries written before (or, in a rolling upgrade, beside) this version are not stranded.
"""

from __future__ import annotations

import heapq
import time
import zlib
from dataclasses import dataclass
from typing import cast

from compaction_worker.settings import DEFAULT_INDEX_SHARDS
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script, as_text


def now_ms() -> int:
    return int(time.time() * 1000)


def shard_of(conversation_id: str, shards: int) -> int:
    """The bucket of a conversation: CRC-32 of its id, so every process and version agrees."""
    return zlib.crc32(conversation_id.encode()) % shards


def bucket_keys(base: str, shards: int) -> tuple[str, ...]:
    """The bucket keys of the index named ``base``; each is its own hash tag (its own slot)."""
    return tuple(f"{{{base}:{n}}}" for n in range(shards))


def bucket_key(base: str, conversation_id: str, shards: int = DEFAULT_INDEX_SHARDS) -> str:
    """The bucket key of the index named ``base`` that holds this conversation's entry."""
    return f"{{{base}:{shard_of(conversation_id, shards)}}}"


@dataclass(frozen=True, slots=True)
class IndexStats:
    """How many conversations an index holds, and the lowest score (epoch ms; None when empty)."""

    count: int
    lowest_ms: float | None


class ShardedIndex:
    """One index's buckets: add, list due members across buckets (oldest first), count."""

    def __init__(self, redis: RedisClient, base: str, shards: int = DEFAULT_INDEX_SHARDS) -> None:
        self.redis = redis
        self.base = base
        """The index's name, and the single key it was before buckets (read by the sweep)."""
        self.keys = bucket_keys(base, shards)
        self._move = Script(redis, "lease_drop.lua")

    def key_of(self, conversation_id: str) -> str:
        """The bucket key that holds this conversation's entry."""
        return self.keys[shard_of(conversation_id, len(self.keys))]

    async def add(
        self, conversation_id: str, score: float, *, existing_only: bool = False, lower_only: bool = False
    ) -> None:
        """Set a conversation's score (``existing_only``: if it is there; ``lower_only``: if lower or new)."""
        await self.redis.zadd(
            self.key_of(conversation_id), {conversation_id: score}, xx=existing_only, lt=lower_only
        )

    async def remove(self, conversation_id: str) -> None:
        """Drop a conversation's entry."""
        await self.redis.zrem(self.key_of(conversation_id), conversation_id)

    async def score(self, conversation_id: str) -> float | None:
        """A conversation's score, None if it is not indexed."""
        value = await self.redis.zscore(self.key_of(conversation_id), conversation_id)
        return None if value is None else float(value)

    async def due(self, limit: int, until_ms: float) -> list[str]:
        """Up to ``limit`` members scored at or before ``until_ms``, oldest first over all buckets.

        One pipelined read of every bucket (each bounded by ``limit``), merged by score.
        """
        await self._migrate(limit, until_ms)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.zrangebyscore(key, "-inf", until_ms, start=0, num=limit, withscores=True)
            replies: list[list[tuple[bytes | str, float]]] = await pipe.execute()
        merged = heapq.merge(*replies, key=lambda pair: pair[1])
        return [as_text(member) for member, _ in list(merged)[:limit]]

    async def stats(self) -> IndexStats:
        """Count and lowest score over every bucket (and the pre-bucket key), in one pipelined read."""
        keys = (*self.keys, self.base)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zcard(key)
            for key in keys:
                pipe.zrange(key, 0, 0, withscores=True)
            replies = await pipe.execute()
        counts, firsts = replies[: len(keys)], replies[len(keys) :]
        lowest = [float(first[0][1]) for first in firsts if first]
        return IndexStats(sum(int(c) for c in counts), min(lowest) if lowest else None)

    async def count(self) -> int:
        """How many conversations the index holds."""
        return (await self.stats()).count

    async def _migrate(self, limit: int, until_ms: float) -> None:
        """Move due entries of the pre-bucket key into their buckets (a no-op once it is empty).

        NX keeps an entry the bucket already has; the old entry goes only if its score did not
        change meanwhile (an older worker re-armed it: the next sweep moves it again).
        """
        old = await self.redis.zrangebyscore(self.base, "-inf", until_ms, start=0, num=limit, withscores=True)
        for member, score in cast(list[tuple[bytes | str, float]], old):
            cid = as_text(member)
            await self.redis.zadd(self.key_of(cid), {cid: score}, nx=True)
            await self._move([self.base], member=cid, lease_ms=repr(float(score)))


class LeasedIndex:
    """Arms, lists, claims and drops the conversations of one sharded index."""

    def __init__(self, redis: RedisClient, base: str, shards: int = DEFAULT_INDEX_SHARDS) -> None:
        self.redis = redis
        self.index = ShardedIndex(redis, base, shards)
        self._claim = Script(redis, "lease_claim.lua")
        self._drop = Script(redis, "lease_drop.lua")

    def key_of(self, conversation_id: str) -> str:
        """The bucket key that holds this conversation's entry."""
        return self.index.key_of(conversation_id)

    async def arm(self, conversation_id: str, at_ms: float, *, existing_only: bool = False) -> None:
        """Look at a conversation at ``at_ms`` (``existing_only``: only if it is indexed)."""
        await self.index.add(conversation_id, at_ms, existing_only=existing_only)

    async def due(self, limit: int, at_ms: int | None = None) -> list[str]:
        """Conversations due by ``at_ms`` (default now), or whose lease ran out, oldest first."""
        return await self.index.due(limit, now_ms() if at_ms is None else at_ms)

    async def claim(self, conversation_id: str, now: int, lease_ms: float) -> bool:
        """Move a due entry's score to the end of a lease; False if it is not due (or not indexed)."""
        key = self.key_of(conversation_id)
        got = await self._claim([key], member=conversation_id, now_ms=str(now), lease_ms=repr(lease_ms))
        return got is not None

    async def drop(self, conversation_id: str, lease_ms: float) -> bool:
        """Remove the entry only if the lease ``lease_ms`` still stands; True if it did."""
        key = self.key_of(conversation_id)
        return bool(await self._drop([key], member=conversation_id, lease_ms=repr(lease_ms)))

    async def count(self) -> int:
        """How many conversations the index holds."""
        return await self.index.count()

    async def stats(self) -> IndexStats:
        """Count and lowest score (a leased entry scores its lease's end)."""
        return await self.index.stats()
