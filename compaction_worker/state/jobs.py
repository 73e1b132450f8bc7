"""Pending compactions: each conversation's job, the index of when to look, and the claim.

A job lives in two places: the ``job_*`` fields of the conversation's meta hash (what to do;
the conversation core decides it: conversation/meta.py, ``recorded``) and a global index
(when to look at it next). A worker claims a job by taking the conversation's lock, so that
another worker finishes the job of one that dies once its lock expires (docs/design.md, "Jobs").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from compaction_worker.contracts.events import Trigger
from compaction_worker.conversation.apply import record_request
from compaction_worker.conversation.keys import conversation_keys, jobs_index_key
from compaction_worker.conversation.meta import (
    JOB_FIELDS,
    Job,
    JobRequest,
    has_job,
    job_traceparent,
    read_job,
)
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import Scan, ShardedIndex, now_ms
from compaction_worker.state.lock import Busy, Lease, Locks
from compaction_worker.state.scripts import Script
from compaction_worker.state.wake import Wakes

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Claim:
    """A job a worker took: the conversation's lock (with its fence) and the job it found."""

    conversation_id: str
    lease: Lease
    job: Job
    finished: bool = False


class JobQueue:
    """Records, schedules, claims and finishes pending compactions.

    A job is recorded before it is indexed, and its index entry is removed before the job
    hash is read again: a job always has an entry, or gets one from its writer
    (docs/design.md, "Jobs"). The claim is the conversation's lock.
    """

    def __init__(
        self,
        redis: RedisClient,
        prefix: str,
        locks: Locks,
        *,
        shards: int,
        wakes: Wakes | None = None,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.locks = locks
        self.index = ShardedIndex(redis, jobs_index_key(prefix), shards, wakes=wakes)
        self._finish = Script(redis, "job_finish.lua")

    def _key(self, conversation_id: str) -> str:
        return conversation_keys(conversation_id, self.prefix).meta

    async def schedule(
        self,
        conversation_id: str,
        trigger: Trigger,
        error: str | None = None,
        *,
        delay_seconds: float = 0.0,
        traceparent: str | None = None,
    ) -> bool:
        """Record a compaction request, then make it due (now, or after a delay); True if it is new
        or stronger than the pending one.

        A request that changes nothing indexes the pending job only if it is not indexed: that
        heals a writer that died between its two writes, and keeps a pending job's delay.
        """
        request = JobRequest(trigger, error, traceparent=traceparent)
        new = await record_request(self.redis, self._key(conversation_id), request)
        if new:
            await self.mark_due(conversation_id, delay_seconds)
        else:
            await self.index.add(conversation_id, now_ms() + int(delay_seconds * 1000), missing_only=True)
        return new

    async def mark_due(self, conversation_id: str, delay_seconds: float = 0.0) -> None:
        """Make a conversation's job due (now, or after a delay); after the job is written."""
        await self.index.add(conversation_id, now_ms() + int(delay_seconds * 1000))

    async def job(self, conversation_id: str) -> Job | None:
        """The pending compaction request of a conversation, if any."""
        return await read_job(self.redis, self._key(conversation_id), conversation_id)

    async def traceparent(self, conversation_id: str) -> str | None:
        """The trace context the pending job keeps (the turn's that asked for it), if any."""
        return await job_traceparent(self.redis, self._key(conversation_id))

    async def due(self, limit: int) -> list[str]:
        """Conversations whose job is due, oldest first."""
        return (await self.scan(limit)).due

    async def scan(self, limit: int) -> Scan:
        """Conversations whose job is due (oldest first), and when the next one will be (ms)."""
        return await self.index.scan(limit, now_ms())

    @contextlib.asynccontextmanager
    async def claim(self, conversation_id: str) -> AsyncIterator[Claim | None]:
        """Take a conversation's job for the block: the conversation's lock, renewed, is the claim.

        Yields None when another worker holds the lock (the entry is looked at again when that
        lock would expire, never sooner) or when there is no job (the entry goes). A job the
        block does not :meth:`finish` is handed back after the lock is released: due at once,
        or after the lock's TTL if the block raised (a run that keeps failing is no hot loop).
        """
        cid = conversation_id
        keys = conversation_keys(cid, self.prefix)
        lease = await self.locks.acquire(cid, keys)
        if isinstance(lease, Busy):  # look at its entry when that lock would expire, not sooner
            log.debug("%s is locked by another run; looking again in %d ms", cid, lease.until_ms - now_ms())
            await self.index.add(cid, lease.until_ms, existing_only=True, later_only=True)
            yield None
            return
        claim: Claim | None = None
        again = 0.0
        try:
            async with self.locks.kept(lease, keys):
                job = await self.job(cid)
                if job is None:
                    await self._unindex(cid)
                else:
                    # While it runs, the entry says when to look if this worker dies: when its lock would.
                    lock_end = now_ms() + self.locks.ttl_ms
                    await self.index.add(cid, lock_end, existing_only=True, later_only=True)
                    claim = Claim(cid, lease, job)
                try:
                    yield claim
                except Exception:
                    again = self.locks.ttl_ms / 1000
                    raise
        finally:
            if claim is not None and not claim.finished:
                try:
                    await asyncio.shield(self.mark_due(cid, again))
                except Exception:  # Redis away: the entry stays scored at the lock's end, looked at then
                    log.warning("could not hand back the job of %s", cid, exc_info=True)

    async def finish(self, claim: Claim) -> None:
        """Drop the job that ran (unless a newer request replaced it, or another run took the
        lock over), then the index entry, unless a job is pending by then."""
        keys = conversation_keys(claim.conversation_id, self.prefix)
        await self._finish(
            [keys.meta, keys.lock], id=claim.job.id, token=claim.lease.token, fields=JOB_FIELDS
        )
        claim.finished = True
        await self._unindex(claim.conversation_id)

    async def _unindex(self, conversation_id: str) -> None:
        """Remove the entry, then read the job again: a request recorded meanwhile, whose
        writer may not have indexed it yet, is indexed here and never left without an entry."""
        await self.index.remove(conversation_id)
        if await has_job(self.redis, self._key(conversation_id)):
            await self.mark_due(conversation_id)

    async def pending_count(self) -> int:
        """How many conversations have an entry in the index."""
        return await self.index.count()
