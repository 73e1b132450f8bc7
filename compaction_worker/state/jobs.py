"""Pending compactions: each conversation's job hash, and the index that leases them to workers.

A job lives in two places: the conversation's ``job`` hash (what to do) and a global index
(when to look at it next), claimed with a lease so that another worker finishes the job
of one that dies (docs/design.md, "Jobs").
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from compaction_worker.contracts.events import Trigger
from compaction_worker.settings import DEFAULT_INDEX_SHARDS, DEFAULT_PREFIX
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import IndexStats, LeasedIndex, now_ms
from compaction_worker.state.keys import conversation_keys
from compaction_worker.state.scripts import Script, as_text

JOB_PRIORITY = {
    Trigger.SOFT_THRESHOLD: 0,
    Trigger.THRESHOLD: 1,
    Trigger.MANUAL: 2,
    Trigger.REACTIVE: 3,
}
"""A pending job is replaced only by a request of higher priority."""

SET_JOB_LUA = "job.lua"
"""The library that defines ``set_job``, for scripts that record a job with other writes."""


def jobs_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The job index's name (its buckets: index.bucket_keys): conversations with a pending compaction.

    Scored by when to look next (ms); also the single key of the versions before buckets.
    """
    return f"{prefix}:jobs"


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


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A compaction request, recorded as a new job unless a stronger one is pending."""

    trigger: Trigger
    error: str | None = None
    estimate: int = 0
    """See :attr:`Job.estimate`."""
    traceparent: str | None = None
    """See :attr:`Job.traceparent`."""

    def fields(self) -> dict[str, str]:
        """The job hash a new job gets (strings only, as the scripts store them)."""
        return {
            "id": secrets.token_hex(8),
            "priority": str(JOB_PRIORITY[self.trigger]),
            "trigger": self.trigger.value,
            "requested_at": repr(time.time()),
            "error": self.error or "",
            "estimate": str(self.estimate),
            "traceparent": self.traceparent or "",
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's lease on a conversation's entry in the job index."""

    conversation_id: str
    lease_ms: int


class JobQueue:
    """Records, schedules, claims and finishes pending compactions.

    The index is written before the hash, so a crash between the two leaves at worst an
    index entry without a job, which the next claim cleans up.
    """

    def __init__(
        self, redis: RedisClient, prefix: str, lease_seconds: float, *, shards: int = DEFAULT_INDEX_SHARDS
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.index = LeasedIndex(redis, jobs_index_key(prefix), shards)
        self.lease_ms = max(1000, int(lease_seconds * 1000))
        self._set = Script(redis, SET_JOB_LUA, "job_set.lua")
        self._finish = Script(redis, "job_finish.lua")

    def _key(self, conversation_id: str) -> str:
        return conversation_keys(conversation_id, self.prefix).job

    async def schedule(
        self,
        conversation_id: str,
        trigger: Trigger,
        error: str | None = None,
        *,
        delay_seconds: float = 0.0,
        traceparent: str | None = None,
    ) -> bool:
        """Record a compaction request (due now, or after a delay); True if it is new or stronger than the pending one."""
        await self.mark_due(conversation_id, delay_seconds)
        request = JobRequest(trigger, error, traceparent=traceparent)
        return bool(await self._set([self._key(conversation_id)], **request.fields()))

    async def mark_due(self, conversation_id: str, delay_seconds: float = 0.0) -> None:
        """Make a conversation's job due (now, or after a delay)."""
        await self.index.arm(conversation_id, now_ms() + int(delay_seconds * 1000))

    async def ensure_due(self, conversation_id: str) -> bool:
        """Make the conversation's job due if it has one; True if it has.

        For the redelivery of a turn whose append recorded a request: the crash may have come
        between the append and the indexing.
        """
        if await self.job(conversation_id) is None:
            return False
        await self.mark_due(conversation_id)
        return True

    async def job(self, conversation_id: str) -> Job | None:
        """The pending compaction request of a conversation, if any."""
        raw = await self.redis.hgetall(self._key(conversation_id))
        if not raw:
            return None
        data = {as_text(k): as_text(v) for k, v in raw.items()}
        return Job(
            conversation_id=conversation_id,
            id=data["id"],
            trigger=Trigger(data["trigger"]),
            requested_at=float(data.get("requested_at") or 0),
            error=data.get("error") or None,
            estimate=int(data.get("estimate") or 0),
            traceparent=data.get("traceparent") or None,
        )

    async def due(self, limit: int) -> list[str]:
        """Conversations whose job is due or whose lease ran out, oldest first."""
        return await self.index.due(limit)

    async def claim(self, conversation_id: str) -> Claim | None:
        """Take a lease on a due job; None if it is not due or another lease stands."""
        now = now_ms()
        lease = now + self.lease_ms
        return Claim(conversation_id, lease) if await self.index.claim(conversation_id, now, lease) else None

    async def load(self, claim: Claim) -> Job | None:
        """The job a claim points at, if there still is one."""
        return await self.job(claim.conversation_id)

    async def finish(self, claim: Claim, job: Job | None) -> None:
        """Drop the job that ran; a newer request stays and becomes due at once."""
        cid = claim.conversation_id
        if job is not None and await self._finish([self._key(cid)], id=job.id):
            still_pending = False
        else:
            still_pending = await self.job(cid) is not None
        if still_pending:
            await self.mark_due(cid)
        else:
            await self.index.drop(cid, claim.lease_ms)

    async def postpone(self, claim: Claim, seconds: float) -> None:
        """Look at the job again after a delay (its conversation is busy elsewhere)."""
        await self.index.arm(claim.conversation_id, now_ms() + int(seconds * 1000), existing_only=True)

    async def hand_back(self, claim: Claim) -> None:
        """Make a claimed job due again now (this worker is shutting down)."""
        await self.index.arm(claim.conversation_id, now_ms(), existing_only=True)

    async def pending_count(self) -> int:
        """How many conversations have an entry in the index."""
        return await self.index.count()

    async def stats(self) -> IndexStats:
        """Pending count and lowest score: a due job's due time, or a running one's lease end (ms)."""
        return await self.index.stats()
