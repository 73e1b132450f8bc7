"""A global index of conversations with leases: the job index and the outbox index.

A sorted set of conversation ids scored by when to look at them next (epoch ms). It lives
outside the conversations' hash slots, so it is never written in the same script as a
conversation's keys; its owners order their writes instead (docs/design.md).
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from compaction_worker.state.scripts import Script, as_text


def now_ms() -> int:
    return int(time.time() * 1000)


class LeasedIndex:
    """Arms, lists, claims and drops the conversations of one index."""

    def __init__(self, redis: Redis, key: str) -> None:
        self.redis = redis
        self.key = key
        self._claim = Script(redis, "lease_claim.lua")
        self._drop = Script(redis, "lease_drop.lua")

    async def arm(self, conversation_id: str, at_ms: float, *, existing_only: bool = False) -> None:
        """Look at a conversation at ``at_ms`` (``existing_only``: only if it is indexed)."""
        await self.redis.zadd(self.key, {conversation_id: at_ms}, xx=existing_only)

    async def due(self, limit: int, at_ms: int | None = None) -> list[str]:
        """Conversations due by ``at_ms`` (default now), or whose lease ran out, oldest first."""
        until = now_ms() if at_ms is None else at_ms
        return [
            as_text(r) for r in await self.redis.zrangebyscore(self.key, "-inf", until, start=0, num=limit)
        ]

    async def claim(self, conversation_id: str, now: int, lease_ms: float) -> bool:
        """Move a due entry's score to the end of a lease; False if it is not due (or not indexed)."""
        got = await self._claim([self.key], member=conversation_id, now_ms=str(now), lease_ms=repr(lease_ms))
        return got is not None

    async def drop(self, conversation_id: str, lease_ms: float) -> bool:
        """Remove the entry only if the lease ``lease_ms`` still stands; True if it did."""
        return bool(await self._drop([self.key], member=conversation_id, lease_ms=repr(lease_ms)))

    async def count(self) -> int:
        """How many conversations the index holds."""
        return int(await self.redis.zcard(self.key))
