"""Pending compactions: each conversation's job, the index of when to look, and the claim.

A job lives in two places: the ``job_*`` fields of the conversation's meta hash (what to do;
a turn planned on the meta knows the job it may replace: runtime/plan.py) and a global index
(when to look at it next). A worker claims a job by taking the conversation's lock, so that
another worker finishes the job of one that dies once its lock expires (docs/design.md, "Jobs").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from compaction_worker.contracts.events import MAX_INSTRUCTIONS_CHARS, Trigger
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import Scan, ShardedIndex, now_ms
from compaction_worker.state.keys import conversation_keys, jobs_index_key
from compaction_worker.state.lock import Busy, Lease, Locks
from compaction_worker.state.meta import Meta
from compaction_worker.state.scripts import Script, as_text
from compaction_worker.state.wake import Wakes

log = logging.getLogger(__name__)

JOB_PRIORITY = {
    Trigger.SOFT_THRESHOLD: 0,
    Trigger.THRESHOLD: 1,
    Trigger.MANUAL: 2,
    Trigger.REACTIVE: 3,
}
"""A pending job is replaced only by a request of higher priority."""


@dataclass(frozen=True, slots=True)
class Job:
    """A pending compaction of one conversation."""

    conversation_id: str
    id: str
    trigger: Trigger
    requested_at: float
    error: str | None = None
    estimate: int = 0
    """Our estimate (uncalibrated) of the prompt a reactive request's error is about; 0 if unknown."""
    traceparent: str | None = None
    """The W3C trace context of the turn that asked for it: the compaction continues that trace."""
    instructions: str | None = None
    """What the request asked the summary to keep first (added to the conversation's standing ones)."""


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A compaction request, recorded as a new job unless a stronger one is pending."""

    trigger: Trigger
    error: str | None = None
    estimate: int = 0
    """See :attr:`Job.estimate`."""
    traceparent: str | None = None
    """See :attr:`Job.traceparent`."""
    instructions: str | None = None
    """See :attr:`Job.instructions`."""

    @property
    def asked(self) -> bool:
        """Whether someone asked for it (a turn's request: manual or reactive), not a threshold."""
        return self.trigger in (Trigger.MANUAL, Trigger.REACTIVE)

    @property
    def priority(self) -> int:
        return JOB_PRIORITY[self.trigger]

    def fields(self, now: float | None = None) -> dict[str, str]:
        """The meta fields a new job writes (strings, as stored), at ``now`` (else the clock's)."""
        return {
            "job_id": secrets.token_hex(8),
            "job_priority": str(self.priority),
            "job_trigger": self.trigger.value,
            "job_requested_at": repr(time.time() if now is None else now),
            "job_error": self.error or "",
            "job_estimate": str(self.estimate),
            "job_traceparent": self.traceparent or "",
            "job_instructions": self.instructions or "",
        }


JOB_FIELDS = tuple(JobRequest(Trigger.MANUAL).fields())
"""The meta fields a job is (every one written when it is recorded, and deleted when it ends)."""


MAX_MERGED_INSTRUCTIONS = 2 * MAX_INSTRUCTIONS_CHARS
"""The most a pending job's instructions grow to when a turn's request adds its own."""


def merged_instructions(own: str, other: str, newest: str) -> str:
    """A job's instructions once another request's are added: a request's instructions are never
    dropped while a job is pending. Whichever request's job stays carries the other's after its
    own; past :data:`MAX_MERGED_INSTRUCTIONS`, the newest request's alone."""
    if not other or other in own:
        return own
    if not own or own in other:
        return other
    if len(own) + len(other) + 2 > MAX_MERGED_INSTRUCTIONS:
        return newest
    return f"{own}\n\n{other}"


def recorded(request: JobRequest, pending: Meta, now: float) -> tuple[dict[str, str], bool]:
    """What a turn's request writes onto the job pending in ``pending`` (a meta), and whether it is
    the job now: a new job when none of equal or higher priority is pending, else at most the
    pending job's instructions with the request's added."""
    asked = request.instructions or ""
    if pending.job_id and pending.job_priority >= request.priority:
        kept = merged_instructions(pending.job_instructions, asked, asked)
        return ({"job_instructions": kept} if kept != pending.job_instructions else {}), False
    fields = request.fields(now)
    fields["job_instructions"] = merged_instructions(asked, pending.job_instructions, asked)
    return fields, True


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
        self._set = Script(redis, "job_set.lua")
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
        new = bool(await self._set([self._key(conversation_id)], job=request.fields()))
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
        raw = await self.redis.hmget(self._key(conversation_id), JOB_FIELDS)
        data = dict(zip(JOB_FIELDS, (as_text(v) if v is not None else "" for v in raw), strict=True))
        if not data["job_id"]:
            return None
        return Job(
            conversation_id=conversation_id,
            id=data["job_id"],
            trigger=Trigger(data["job_trigger"]),
            requested_at=float(data["job_requested_at"] or 0),
            error=data["job_error"] or None,
            estimate=int(data["job_estimate"] or 0),
            traceparent=data["job_traceparent"] or None,
            instructions=data["job_instructions"] or None,
        )

    async def traceparent(self, conversation_id: str) -> str | None:
        """The trace context the pending job keeps (the turn's that asked for it), if any."""
        value = await self.redis.hget(self._key(conversation_id), "job_traceparent")
        return as_text(value) if value else None

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
        if await self.redis.hexists(self._key(conversation_id), "job_id"):
            await self.mark_due(conversation_id)

    async def pending_count(self) -> int:
        """How many conversations have an entry in the index."""
        return await self.index.count()
