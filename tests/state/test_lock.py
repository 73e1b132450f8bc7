"""The per-conversation lock: exclusive, fenced, renewed while held, released by its holder."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from compaction_worker.state.keys import conversation_keys
from compaction_worker.state.lock import Locks

pytestmark = pytest.mark.integration

KEYS = conversation_keys("c", "t")


async def test_exclusive_and_fenced(redis_client: redis.asyncio.Redis) -> None:
    """Reference 003 (Decision 10, a per-conversation lock): a second acquirer gets nothing; every acquisition gets a higher fence."""
    locks = Locks(redis_client, 30)
    first = await locks.acquire("c", KEYS)
    assert first is not None
    assert await locks.acquire("c", KEYS) is None
    await locks.release(first, KEYS)
    second = await locks.acquire("c", KEYS)
    assert second is not None
    assert second.fence == first.fence + 1


async def test_release_only_by_holder(redis_client: redis.asyncio.Redis) -> None:
    """A stale holder's release does not free someone else's lock."""
    locks = Locks(redis_client, 0.1)
    stale = await locks.acquire("c", KEYS)
    assert stale is not None
    await asyncio.sleep(0.15)
    current = await locks.acquire("c", KEYS)
    assert current is not None
    await locks.release(stale, KEYS)
    assert await redis_client.get(KEYS.lock) == current.token.encode()
    assert not await locks.renew(stale, KEYS)
    assert stale.lost.is_set()


async def test_held_renews_beyond_ttl(redis_client: redis.asyncio.Redis) -> None:
    """Inside ``held`` the lock outlives its TTL and is gone afterwards."""
    locks = Locks(redis_client, 0.3)
    async with locks.held("c", KEYS) as lease:
        assert lease is not None
        await asyncio.sleep(0.8)
        assert await redis_client.get(KEYS.lock) == lease.token.encode()
        assert not lease.lost.is_set()
    assert await redis_client.get(KEYS.lock) is None


async def test_held_yields_none_when_busy(redis_client: redis.asyncio.Redis) -> None:
    """A busy lock yields None instead of waiting."""
    locks = Locks(redis_client, 30)
    async with locks.held("c", KEYS) as first, locks.held("c", KEYS) as second:
        assert first is not None
        assert second is None
