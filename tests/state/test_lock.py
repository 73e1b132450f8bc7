"""The per-conversation lock: exclusive, fenced, renewed while held, released by its holder."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import redis.asyncio

from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.state.lock import Busy, Lease, Locks

pytestmark = pytest.mark.integration

KEYS = conversation_keys("c", "t")


async def test_exclusive_and_fenced(redis_client: redis.asyncio.Redis) -> None:
    """Reference 003 (Decision 10, a per-conversation lock): a second acquirer gets nothing; every acquisition gets a higher fence."""
    locks = Locks(redis_client, 30)
    first = await locks.acquire("c", KEYS)
    assert isinstance(first, Lease)
    busy = await locks.acquire("c", KEYS)
    assert isinstance(busy, Busy)
    await locks.release(first, KEYS)
    second = await locks.acquire("c", KEYS)
    assert isinstance(second, Lease)
    assert second.fence == first.fence + 1


async def test_busy_says_when_the_lock_would_expire(redis_client: redis.asyncio.Redis) -> None:
    """A busy lock reports its holder's expiry, so that whoever skips it looks again then, not sooner."""
    locks = Locks(redis_client, 30)
    before = time.time() * 1000
    assert isinstance(await locks.acquire("c", KEYS), Lease)
    busy = await locks.acquire("c", KEYS)
    assert isinstance(busy, Busy)
    assert before + 29_000 < busy.until_ms <= time.time() * 1000 + 30_000


async def test_release_only_by_holder(redis_client: redis.asyncio.Redis) -> None:
    """A stale holder's release does not free someone else's lock."""
    locks = Locks(redis_client, 0.1)
    stale = await locks.acquire("c", KEYS)
    assert isinstance(stale, Lease)
    await asyncio.sleep(0.15)
    current = await locks.acquire("c", KEYS)
    assert isinstance(current, Lease)
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


async def test_the_renewal_stops_even_if_its_cancellation_is_lost(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's ``asyncio.wait_for`` (every redis-py command goes through it) can swallow a
    cancellation that arrives as the call completes. A renewal that lost its cancellation used to
    run, and keep the lock alive, forever after its block ended: its conversation's jobs found the
    lock busy ever after. The block's end now stops it by a flag too, and the lock goes."""
    locks = Locks(redis_client, 0.3)
    renew = locks.renew
    in_flight = asyncio.Event()

    async def renew_losing_the_cancellation(lease: Lease, keys: object) -> bool:
        in_flight.set()
        with contextlib.suppress(asyncio.CancelledError):  # a call in flight when the block ends
            await asyncio.Event().wait()  # completes, and the cancellation is gone
        return await renew(lease, KEYS)

    monkeypatch.setattr(locks, "renew", renew_losing_the_cancellation)
    lease = await locks.acquire("c", KEYS)
    assert isinstance(lease, Lease)

    async def hold() -> None:
        async with locks.kept(lease, KEYS):
            await in_flight.wait()

    holder = asyncio.create_task(hold())
    ended, _ = await asyncio.wait([holder], timeout=10)  # not wait_for: it would cancel the block
    assert holder in ended, "the block never ended: its renewal outlived it"
    assert await redis_client.get(KEYS.lock) is None
