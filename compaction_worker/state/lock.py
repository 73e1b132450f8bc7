"""The per-conversation lock with a fencing token, renewed while a compaction runs.

The lock keeps two workers from spending LLM calls on the same conversation; the fence
is what makes commits correct: every acquisition increments it, and the commit script
refuses a writer whose fence is no longer current or whose lock has expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis

from compaction_worker.state.keys import ConversationKeys

log = logging.getLogger(__name__)

# KEYS: lock, fence. ARGV: token, ttl_ms. Returns the new fence, or nil if held.
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return nil
"""

# KEYS: lock. ARGV: token, ttl_ms. Extends the lock only for its holder.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lock. ARGV: token. Deletes the lock only for its holder.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(slots=True)
class Lease:
    """A held lock: its token, its fence, and whether renewal has failed since."""

    conversation_id: str
    token: str
    fence: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class Locks:
    """Acquires, renews and releases per-conversation locks."""

    def __init__(self, redis: Redis, ttl_seconds: float) -> None:
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def acquire(self, conversation_id: str, keys: ConversationKeys) -> Lease | None:
        """Take the lock if it is free; None when another worker holds it."""
        token = secrets.token_hex(16)
        fence = await self._acquire(keys=[keys.lock, keys.fence], args=[token, self.ttl_ms])
        if fence is None:
            return None
        return Lease(conversation_id=conversation_id, token=token, fence=int(fence))

    async def renew(self, lease: Lease, keys: ConversationKeys) -> bool:
        """Extend the lock; False (and ``lease.lost`` set) when it is no longer ours."""
        ok = bool(await self._renew(keys=[keys.lock], args=[lease.token, self.ttl_ms]))
        if not ok:
            lease.lost.set()
        return ok

    async def release(self, lease: Lease, keys: ConversationKeys) -> None:
        """Give the lock back if it is still ours."""
        await self._release(keys=[keys.lock], args=[lease.token])

    @contextlib.asynccontextmanager
    async def held(self, conversation_id: str, keys: ConversationKeys) -> AsyncIterator[Lease | None]:
        """Hold the lock for the block, renewing it every third of its TTL; yields None if busy."""
        lease = await self.acquire(conversation_id, keys)
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
