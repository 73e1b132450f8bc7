"""The index of pending compactions, with leases, so that any worker can finish them.

A job lives in two places: the conversation's ``job`` hash (what to do, written by the
store, in the conversation's hash slot) and this global sorted set (when to look at it
next, in epoch milliseconds). The index is written before the hash, so a crash between
the two leaves at worst an index entry without a job, which the next claim cleans up;
a job recorded by the append script is indexed right after it, and again whenever its
turn is redelivered. Claiming moves the score to the end of a lease: a worker that dies
mid-compaction lets the lease run out, and another worker claims the job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from compaction_worker.contracts.events import Trigger
from compaction_worker.state.keys import jobs_index_key
from compaction_worker.state.store import Job, Store, as_text

# KEYS: index. ARGV: conversation, now_ms, lease_until_ms. Returns the lease score, or nil.
CLAIM_SCRIPT = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then return nil end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return ARGV[3]
"""

# KEYS: index. ARGV: conversation, lease score. Removes the entry only if our lease still stands.
UNINDEX_SCRIPT = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's lease on a conversation's entry in the job index."""

    conversation_id: str
    lease_ms: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class JobQueue:
    """Schedules, claims and finishes pending compactions."""

    def __init__(self, store: Store, lease_seconds: float) -> None:
        self.store = store
        self.redis = store.redis
        self.index = jobs_index_key(store.prefix)
        self.lease_ms = max(1000, int(lease_seconds * 1000))
        self._claim = self.redis.register_script(CLAIM_SCRIPT)
        self._unindex = self.redis.register_script(UNINDEX_SCRIPT)

    async def schedule(
        self, conversation_id: str, trigger: Trigger, error: str | None = None, *, delay_seconds: float = 0.0
    ) -> bool:
        """Record a compaction request (due now, or after a delay); True if it is new or stronger than the pending one."""
        await self.mark_due(conversation_id, delay_seconds)
        return await self.store.set_job(conversation_id, trigger, error)

    async def mark_due(self, conversation_id: str, delay_seconds: float = 0.0) -> None:
        """Make a conversation's job due (now, or after a delay)."""
        await self.redis.zadd(self.index, {conversation_id: _now_ms() + int(delay_seconds * 1000)})

    async def due(self, limit: int) -> list[str]:
        """Conversations whose job is due or whose lease ran out, oldest first."""
        raw = await self.redis.zrangebyscore(self.index, "-inf", _now_ms(), start=0, num=limit)
        return [as_text(r) for r in raw]

    async def claim(self, conversation_id: str) -> Claim | None:
        """Take a lease on a due job; None if it is not due or another lease stands."""
        now = _now_ms()
        lease = now + self.lease_ms
        got = await self._claim(keys=[self.index], args=[conversation_id, now, lease])
        return None if got is None else Claim(conversation_id, lease)

    async def load(self, claim: Claim) -> Job | None:
        """The job a claim points at, if there still is one."""
        return await self.store.job(claim.conversation_id)

    async def finish(self, claim: Claim, job: Job | None) -> None:
        """Drop the job that ran; a newer request stays and becomes due at once."""
        cid = claim.conversation_id
        if job is not None and await self.store.finish_job(cid, job.id):
            still_pending = False
        else:
            still_pending = await self.store.job(cid) is not None
        if still_pending:
            await self.mark_due(cid)
        else:
            await self._unindex(keys=[self.index], args=[cid, claim.lease_ms])

    async def postpone(self, claim: Claim, seconds: float) -> None:
        """Look at the job again after a delay (its conversation is busy elsewhere)."""
        await self.redis.zadd(self.index, {claim.conversation_id: _now_ms() + int(seconds * 1000)}, xx=True)

    async def hand_back(self, claim: Claim) -> None:
        """Make a claimed job due again now (this worker is shutting down)."""
        await self.redis.zadd(self.index, {claim.conversation_id: _now_ms()}, xx=True)

    async def pending_count(self) -> int:
        """How many conversations have an entry in the index."""
        return int(await self.redis.zcard(self.index))
