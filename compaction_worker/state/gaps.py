"""Turns held behind a sequence gap that never fills go to the dead-letter topic.

A turn that arrives ahead of a missing ``turn_seq`` is held in its conversation's
``pending`` hash until the missing turn arrives (turns.py). If that does not happen within
``worker.gap_timeout_seconds``, the held turn is published to the dead-letter topic with
reason ``sequence_gap`` and its original bytes, and removed from the hash.

Expiry never gives up on the missing turn: the conversation keeps waiting for it, and turns
that arrive after an expiry are held again (and expire again). Nothing is applied out of
order and nothing is lost: an operator produces the missing turn, then replays the
dead-lettered ones in order from the DLQ. Expiry touches neither the transcript nor the
effective history nor the metadata.

Which conversations hold turns is a global sorted set (``<prefix>:gaps``) scored by when
the oldest held turn was held (epoch ms), so a sweep reads only what is due. Like the job
index (jobs.py) it lives outside the conversations' hash slots, so it is never written in
the same script as a pending hash (Redis Cluster would refuse it). Instead the writes are
ordered so that a held turn always has an index entry; an entry without held turns is
harmless (the next sweep that reaches it drops it):

* holding writes the hash, then the index, on every attempt, so the redelivery of an
  event whose worker crashed between the two writes repairs it;
* dropping an entry removes it, then reads the hash again and restores the entry if a
  turn was held meanwhile.

A sweep claims expired turns with one script that stamps a lease on each, publishes them,
then deletes each one whose lease is still its own. Two workers sweeping at once therefore
dead-letter each turn once, and a worker that dies or cannot publish between the claim and
the delete leaves the turn to be claimed again when its lease runs out (at least once, as
everywhere on Kafka).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from compaction_worker.errors import BadEventError, DeadLetterReason
from compaction_worker.state.keys import gaps_index_key
from compaction_worker.state.store import Store, as_text, split_fingerprint

log = logging.getLogger(__name__)

CLAIM_LEASE_SECONDS = 60.0
"""How long a sweep owns the turns it claimed: longer than a publish can take (aiokafka's
request timeout is 40 s), short enough that a dead sweeper's claims come back soon."""

DeadLetterSink = Callable[[bytes, str, int, BadEventError], Awaitable[None]]
"""Publishes one held turn to the dead-letter topic: original bytes, conversation, seq, reason."""

# Reads the prefix store.py writes before a held turn: "<held_ms>:" or "<held_ms>/<lease_ms>:".
# Returns the hold time (as written), the lease (0: none) and where the rest starts (the
# original bytes, after the turn's fingerprint if it has one: store.split_fingerprint).
_LUA_HELD = """
local function held_of(value)
  local held, lease, at = string.match(value, '^(%d+)/(%d+):()')
  if held then return held, tonumber(lease), at end
  held, at = string.match(value, '^(%d+):()')
  if held then return held, 0, at end
  return '0', 0, 1
end
"""

# KEYS: pending. ARGV: cutoff_ms, now_ms, lease_until_ms.
# Leases every turn held at or before the cutoff that no live lease covers; returns a flat
# list of (seq, held_ms, fingerprint and original bytes).
_CLAIM = (
    _LUA_HELD
    + """
local out = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local value = fields[i + 1]
  local held, lease, at = held_of(value)
  if tonumber(held) <= tonumber(ARGV[1]) and lease <= tonumber(ARGV[2]) then
    local raw = string.sub(value, at)
    redis.call('HSET', KEYS[1], fields[i], held .. '/' .. ARGV[3] .. ':' .. raw)
    out[#out + 1] = fields[i]
    out[#out + 1] = held
    out[#out + 1] = raw
  end
end
return out
"""
)

# KEYS: pending. ARGV: seq, lease_until_ms. Deletes the held turn only under our own lease.
_DROP = (
    _LUA_HELD
    + """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if not value then return 0 end
local _, lease = held_of(value)
if lease ~= tonumber(ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""
)

# KEYS: pending. The oldest hold time (epoch ms), or nil when nothing is held.
_OLDEST = (
    _LUA_HELD
    + """
local oldest = nil
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  local held = tonumber((held_of(value)))
  if oldest == nil or held < oldest then oldest = held end
end
if oldest == nil then return false end
return oldest
"""
)


@dataclass(frozen=True, slots=True)
class ExpiredTurn:
    """A held turn that a sweep sent to the dead-letter topic."""

    conversation_id: str
    turn_seq: int
    waited_seconds: float
    detail: str


def _ms(now: float | None) -> int:
    return int((time.time() if now is None else now) * 1000)


class GapIndex:
    """Holds turns behind a gap, indexes the conversations that hold any, and expires them."""

    def __init__(
        self,
        store: Store,
        timeout_seconds: float,
        dead_letter: DeadLetterSink,
        *,
        lease_seconds: float = CLAIM_LEASE_SECONDS,
        batch: int = 100,
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.index = gaps_index_key(store.prefix)
        self.timeout_ms = int(timeout_seconds * 1000)
        self.lease_ms = int(lease_seconds * 1000)
        self.batch = batch
        self.dead_letter = dead_letter
        self.expired = 0
        self._claim = self.redis.register_script(_CLAIM)
        self._drop = self.redis.register_script(_DROP)
        self._oldest = self.redis.register_script(_OLDEST)

    async def hold(
        self,
        conversation_id: str,
        turn_seq: int,
        raw: bytes,
        now: float | None = None,
        *,
        fingerprint: str | None = None,
    ) -> bool:
        """Hold a turn until its gap fills or it times out; False if that seq was already held."""
        at = _ms(now)
        added = await self.store.buffer_pending(conversation_id, turn_seq, raw, at, fingerprint)
        # After the hash, always (see the module docstring); LT keeps the oldest hold time.
        await self.redis.zadd(self.index, {conversation_id: at}, lt=True)
        return added

    async def reindex(self, conversation_id: str) -> None:
        """Score a conversation by its oldest held turn, or drop it from the index if none is held."""
        pending = self.store.keys(conversation_id).pending
        oldest = await self._oldest(keys=[pending])
        if oldest is None:
            await self.redis.zrem(self.index, conversation_id)
            # A turn held between the read and the removal must not be left unindexed.
            oldest = await self._oldest(keys=[pending])
            if oldest is None:
                return
        await self.redis.zadd(self.index, {conversation_id: int(oldest)})

    async def expire(self, now: float | None = None) -> list[ExpiredTurn]:
        """Dead-letter every turn held longer than the timeout; returns what this call sent.

        Safe to run on every worker at once. A publish error propagates (the sweeper logs
        it); the turns it left claimed are claimed again after their lease.
        """
        now_ms = _ms(now)
        expired: list[ExpiredTurn] = []
        for cid in await self._due(now_ms):
            expired.extend(await self._expire(cid, now_ms))
            await self.reindex(cid)
        self.expired += len(expired)
        return expired

    async def held_count(self) -> int:
        """How many conversations hold turns behind a gap (as far as the index knows)."""
        return int(await self.redis.zcard(self.index))

    async def _due(self, now_ms: int) -> list[str]:
        """Conversations whose oldest held turn has waited past the timeout, oldest first."""
        cutoff = now_ms - self.timeout_ms
        raw = await self.redis.zrangebyscore(self.index, "-inf", cutoff, start=0, num=self.batch)
        return [as_text(r) for r in raw]

    async def _expire(self, cid: str, now_ms: int) -> list[ExpiredTurn]:
        pending = self.store.keys(cid).pending
        lease = now_ms + self.lease_ms
        flat = await self._claim(keys=[pending], args=[now_ms - self.timeout_ms, now_ms, lease])
        if not flat:
            return []
        claimed = sorted((int(flat[i]), int(flat[i + 1]), bytes(flat[i + 2])) for i in range(0, len(flat), 3))
        last_seq = (await self.store.meta(cid)).last_seq
        expired: list[ExpiredTurn] = []
        for seq, held_ms, body in claimed:
            fingerprint, raw = split_fingerprint(body)
            waited = (now_ms - held_ms) / 1000
            bad: BadEventError | None = None
            if seq > last_seq:
                bad = BadEventError(DeadLetterReason.SEQUENCE_GAP, _detail(cid, seq, waited, last_seq), cid)
            else:
                # Held by a worker that lost a race with the append of this very seq (a
                # rebalance overlap): it is stored, so this copy is a duplicate, unless its
                # content differs (turns without a fingerprint are taken as duplicates).
                stored = await self.store.fingerprint(cid, seq)
                if fingerprint is not None and stored is not None and fingerprint != stored:
                    bad = conflicting_duplicate(cid, seq, fingerprint, stored)
                else:
                    log.info("turn %s of %s was applied meanwhile; dropping its held copy", seq, cid)
            if bad is not None:
                await self.dead_letter(raw, cid, seq, bad)
                expired.append(ExpiredTurn(cid, seq, waited, bad.detail))
            if not await self._drop(keys=[pending], args=[seq, lease]):
                log.warning("turn %s of %s outlived its claim; another sweep may send it again", seq, cid)
        return expired

    def __repr__(self) -> str:
        return f"<GapIndex timeout={self.timeout_ms / 1000:g}s expired={self.expired}>"


def conflicting_duplicate(
    cid: str, seq: int, fingerprint: str, kept: str, *, held: bool = False
) -> BadEventError:
    """The error for a turn whose seq another turn, stored or ``held``, already has with other content."""
    word = "held" if held else "stored"
    what = "the turn held behind a gap" if held else "a stored turn"
    return BadEventError(
        DeadLetterReason.CONFLICTING_DUPLICATE,
        f"turn_seq {seq} of {cid} is already taken by {what} with other content "
        f"(fingerprint {fingerprint}, {word} {kept}); the {word} turn is kept",
        cid,
    )


def _detail(cid: str, seq: int, waited: float, last_seq: int) -> str:
    if seq > last_seq + 1:
        return f"turn {seq} of {cid} waited {waited:.0f} s for turn {last_seq + 1}"
    # Its predecessor is stored but nothing released it; cannot happen unless a drain was lost.
    return f"turn {seq} of {cid} waited {waited:.0f} s and was not released after turn {last_seq}"
