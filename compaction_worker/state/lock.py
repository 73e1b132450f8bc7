"""The per-conversation lock and its fence, renewed while a compaction runs.

The lock saves LLM calls; the fence makes commits correct: every acquisition increments it,
and the replace script (store.py) refuses a writer whose fence is stale or whose lock expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from compaction_worker.observability import metrics, tracing
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.keys import ConversationKeys
from compaction_worker.state.scripts import Script

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Lease:
    """A held lock: its token, its fence, and whether renewal has failed since."""

    conversation_id: str
    token: str
    fence: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Locks:
    """Acquires, renews and releases per-conversation locks."""

    def __init__(self, redis: RedisClient, ttl_seconds: float) -> None:
        self.redis = redis
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self._acquire = Script(redis, "lock_acquire.lua")
        self._renew = Script(redis, "lock_renew.lua")
        self._release = Script(redis, "lock_release.lua")

    async def fence(self, keys: ConversationKeys) -> int:
        """The conversation's current fencing token (0 before its first lock)."""
        return int(await self.redis.get(keys.fence) or 0)

    async def acquire(self, conversation_id: str, keys: ConversationKeys) -> Lease | None:
        """Take the lock if it is free; None when another worker holds it."""
        token = secrets.token_hex(16)
        fence = await self._acquire([keys.lock, keys.fence], token=token, ttl_ms=str(self.ttl_ms))
        if fence is None:
            return None
        return Lease(conversation_id=conversation_id, token=token, fence=int(fence))

    async def renew(self, lease: Lease, keys: ConversationKeys) -> bool:
        """Extend the lock; False (and ``lease.lost`` set) when it is no longer ours."""
        ok = bool(await self._renew([keys.lock], token=lease.token, ttl_ms=str(self.ttl_ms)))
        if not ok:
            lease.lost.set()
        return ok

    async def release(self, lease: Lease, keys: ConversationKeys) -> None:
        """Give the lock back if it is still ours."""
        await self._release([keys.lock], token=lease.token)

    @contextlib.asynccontextmanager
    async def held(self, conversation_id: str, keys: ConversationKeys) -> AsyncIterator[Lease | None]:
        """Hold the lock for the block, renewing it every third of its TTL; yields None if busy."""
        with tracing.span(tracing.LOCK_SPAN) as span:
            started = time.perf_counter()
            lease = await self.acquire(conversation_id, keys)
            span.set_attribute("compaction.lock.acquired", lease is not None)
        # Busy is not retried here (the job is postponed): the wait is the acquisition's round trip.
        metrics.record_lock_wait(
            time.perf_counter() - started, acquired=lease is not None, contended=lease is None
        )
        if lease is None:
            yield None
            return
        renewer = asyncio.create_task(self._keep_alive(lease, keys))
        try:
            yield lease
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            try:
                await self.release(lease, keys)
            except Exception:  # the lock expires by itself; a failed release must not mask the block's error
                log.warning("lock release failed", extra={"conversation_id": conversation_id}, exc_info=True)

    async def _keep_alive(self, lease: Lease, keys: ConversationKeys) -> None:
        interval = self.ttl_ms / 3000
        while not lease.lost.is_set():
            await asyncio.sleep(interval)
            try:
                if not await self.renew(lease, keys):
                    log.warning("lock lost", extra={"conversation_id": lease.conversation_id})
            except Exception:  # Redis hiccup: keep trying until the TTL decides
                log.warning(
                    "lock renewal failed", extra={"conversation_id": lease.conversation_id}, exc_info=True
                )
