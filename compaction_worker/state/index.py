"""The shared indexes (jobs, held turns, outbox), sharded into buckets, and their wake-ups.

Each index is a sorted set of conversation ids scored by when to look at them next (epoch
ms), split into ``redis.index_shards`` buckets by a stable hash of the id: each bucket is
its own key under its own hash tag, so on a Redis Cluster the buckets spread over the
slots (and primaries) instead of one shard taking every worker's index traffic. A bucket
lives outside the conversations' slots, so it is never written in the same script as a
conversation's keys; its owners order their writes instead (docs/design.md).

Every write that arms an entry announces it (wake.py), so that no worker polls the buckets
to find it; a sweep (:meth:`ShardedIndex.scan`) reads what is due and when the next entry
will be.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from compaction_worker.conversation.keys import bucket_keys, shard_of
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import as_text
from compaction_worker.state.wake import Wake, Wakes


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class IndexStats:
    """How many conversations an index holds, and the lowest score (epoch ms; None when empty)."""

    count: int
    lowest_ms: float | None


@dataclass(frozen=True, slots=True)
class Scan:
    """What a sweep of an index found: the members due (oldest first), and when to look next.

    ``next_ms`` is the lowest score not yet due, in the index's own scores; None when nothing
    else is indexed. When more members are due than the sweep took, it is the sweep's own
    ``until_ms``: look again at once.
    """

    due: list[str]
    next_ms: float | None


@dataclass(frozen=True, slots=True)
class Sweep:
    """What one pass over an index did: how many entries it acted on, and when its next entry is due (epoch ms)."""

    done: int
    next_ms: float | None


class ShardedIndex:
    """One index's buckets: arm (and announce), remove, sweep across buckets (oldest first), count."""

    def __init__(
        self,
        redis: RedisClient,
        base: str,
        shards: int,
        *,
        wakes: Wakes | None = None,
        due_after_ms: int = 0,
    ) -> None:
        self.redis = redis
        self.base = base
        """The index's name (its buckets' keys are made from it)."""
        self.kind = base.rsplit(":", 1)[-1]
        """The index's name in its wake-ups: ``jobs``, ``gaps``, ``outbox``."""
        self.keys = bucket_keys(base, shards)
        self.wakes = wakes
        self.due_after_ms = due_after_ms
        """How long after its score an entry is due (held turns: scored by when they were held)."""

    def key_of(self, conversation_id: str) -> str:
        """The bucket key that holds this conversation's entry."""
        return self.keys[shard_of(conversation_id, len(self.keys))]

    async def add(
        self,
        conversation_id: str,
        score: float,
        *,
        existing_only: bool = False,
        missing_only: bool = False,
        lower_only: bool = False,
        later_only: bool = False,
    ) -> None:
        """Set a conversation's score and announce when it is due.

        ``existing_only``: if it is indexed; ``missing_only``: if it is not; ``lower_only``:
        if lower or new; ``later_only``: if higher. Unconditional, the two writes go in one
        round trip; conditional, the announcement follows only a change.
        """
        key = self.key_of(conversation_id)
        if not (existing_only or missing_only or lower_only or later_only):
            if self.wakes is None:
                await self.redis.zadd(key, {conversation_id: score})
                return
            wake = self._wake(conversation_id, score)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {conversation_id: score})
                pipe.zadd(self.wakes.key, {wake.member: wake.at_ms}, lt=True)
                await pipe.execute()
            return
        changed = await self.redis.zadd(
            key,
            {conversation_id: score},
            xx=existing_only,
            nx=missing_only,
            lt=lower_only,
            gt=later_only,
            ch=True,
        )
        if changed and self.wakes is not None:
            await self.wakes.announce(self._wake(conversation_id, score))

    def _wake(self, conversation_id: str, score: float) -> Wake:
        return Wake(self.kind, conversation_id, score + self.due_after_ms)

    async def remove(self, conversation_id: str) -> None:
        """Drop a conversation's entry."""
        await self.redis.zrem(self.key_of(conversation_id), conversation_id)

    async def score(self, conversation_id: str) -> float | None:
        """A conversation's score, None if it is not indexed."""
        value = await self.redis.zscore(self.key_of(conversation_id), conversation_id)
        return None if value is None else float(value)

    async def scan(self, limit: int, until_ms: float) -> Scan:
        """The members due by ``until_ms`` (up to ``limit``, oldest first), and the next score after them.

        One pipelined read of every bucket's lowest ``limit`` entries, merged by score: the
        same read says what is due and when the next entry will be.
        """
        limit = max(1, limit)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.zrange(key, 0, limit - 1, withscores=True)
            replies: list[list[tuple[bytes | str, float]]] = await pipe.execute()
        due: list[list[tuple[bytes | str, float]]] = []
        upcoming = math.inf
        for reply in replies:
            ready = [(member, score) for member, score in reply if score <= until_ms]
            due.append(ready)
            if len(ready) < len(reply):
                upcoming = min(upcoming, reply[len(ready)][1])
            elif len(reply) == limit:  # a full page of due entries: there may be more behind it
                upcoming = min(upcoming, until_ms)
        merged = list(heapq.merge(*due, key=lambda pair: pair[1]))
        if len(merged) > limit:
            upcoming = min(upcoming, until_ms)
        members = [as_text(member) for member, _ in merged[:limit]]
        return Scan(members, None if upcoming == math.inf else upcoming)

    async def stats(self) -> IndexStats:
        """Count and lowest score over every bucket, in one pipelined read."""
        keys = self.keys
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
        """How many conversations the index holds (every bucket, one read)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.zcard(key)
            return sum(int(c) for c in await pipe.execute())
