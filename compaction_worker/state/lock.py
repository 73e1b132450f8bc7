"""The per-conversation lock and its fence: the one lease on a conversation, renewed while held.

Whoever holds the lock owns the conversation's background work: a compaction run (the job
claim, as arq's ``in_progress`` key), an outbox relay, a rewind. The lock saves LLM calls;
the fence makes commits correct: every acquisition increments it, and the replace script
(store.py) refuses a writer whose fence is stale or whose lock expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from compaction_worker.conversation.keys import ConversationKeys
from compaction_worker.errors import LockNotAcquiredError
from compaction_worker.observability import metrics, tracing
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Lease:
    """A held lock: its token, its fence, and whether renewal has failed since."""

    conversation_id: str
    token: str
    fence: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class Busy:
    """The lock is held by someone else, until ``until_ms`` (epoch ms) unless its holder renews it."""

    conversation_id: str
    until_ms: int


class Locks:
    """Acquires, renews and releases per-conversation locks."""

    def __init__(self, redis: RedisClient, ttl_seconds: float) -> None:
        self.redis = redis
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self._acquire = Script(redis, "expiry.lua", "lock_acquire.lua")
        self._renew = Script(redis, "lock_renew.lua")
        self._release = Script(redis, "lock_release.lua")

    async def fence(self, keys: ConversationKeys) -> int:
        """The conversation's current fencing token (0 before its first lock)."""
        return int(await self.redis.get(keys.fence) or 0)

    async def acquire(self, conversation_id: str, keys: ConversationKeys) -> Lease | Busy:
        """Take the lock if it is free (never waits); :class:`Busy` says until when another holds it."""
        token = secrets.token_hex(16)
        with tracing.span(tracing.LOCK_SPAN) as span:
            started = time.perf_counter()
            won, value = await self._acquire(
                [keys.lock, keys.fence, keys.meta], token=token, ttl_ms=str(self.ttl_ms)
            )
            span.set_attribute("compaction.lock.acquired", bool(won))
        # Busy is never waited for here (the caller looks again when it would expire): the
        # wait is the acquisition's round trip.
        metrics.record_lock_wait(time.perf_counter() - started, acquired=bool(won))
        if not won:
            return Busy(conversation_id, int(time.time() * 1000) + max(0, int(value)))
        return Lease(conversation_id=conversation_id, token=token, fence=int(value))

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
    async def exclusive(self, conversation_id: str, keys: ConversationKeys) -> AsyncIterator[Lease]:
        """Hold the lock for the block, or raise LockNotAcquiredError at once (a compaction runs):
        what a runtime's or an operator's change of the history (pin, rewind, apply) takes."""
        async with self.held(conversation_id, keys) as lease:
            if lease is None:
                raise LockNotAcquiredError(
                    f"{conversation_id} is being compacted right now; try again shortly"
                )
            yield lease

    @contextlib.asynccontextmanager
    async def held(self, conversation_id: str, keys: ConversationKeys) -> AsyncIterator[Lease | None]:
        """Hold the lock for the block (see :meth:`kept`); yields None if another holds it."""
        lease = await self.acquire(conversation_id, keys)
        if isinstance(lease, Busy):
            yield None
            return
        async with self.kept(lease, keys):
            yield lease

    @contextlib.asynccontextmanager
    async def kept(self, lease: Lease, keys: ConversationKeys) -> AsyncIterator[Lease]:
        """Renew an acquired lock every third of its TTL for the block, then release it.

        The renewal stops on a flag, not on cancellation alone: Python 3.11's
        ``asyncio.wait_for`` (which redis-py sends every command through) can swallow a
        cancellation that arrives as its call completes, and a renewal that missed it would
        keep the lock alive forever after its run ended (docs/design.md, "Locks and fences").
        """
        done = asyncio.Event()
        renewer = asyncio.create_task(
            self._keep_alive(lease, keys, done), name=f"lock:{lease.conversation_id}"
        )
        try:
            yield lease
        finally:
            done.set()
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            try:
                await self.release(lease, keys)
            except Exception:  # the lock expires by itself; a failed release must not mask the block's error
                log.warning("lock release failed", exc_info=True)

    async def _keep_alive(self, lease: Lease, keys: ConversationKeys, done: asyncio.Event) -> None:
        interval = self.ttl_ms / 3000
        while not lease.lost.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await done.wait()
            if done.is_set():
                return
            try:
                if not await self.renew(lease, keys):
                    log.warning("lock lost")
            except Exception:  # Redis hiccup: keep trying until the TTL decides
                log.warning("lock renewal failed", exc_info=True)
