"""The outbox: a committed compaction's ``compaction.completed`` event is never lost.

The event is written by the commit script itself, into the conversation's ``outbox`` hash
(same hash slot, same atomic step as the new history), and published right after. A
worker that dies between the two leaves the event in the hash; any worker's sweeper
publishes it later. Publishing is therefore at least once: consumers de-duplicate
completion events by conversation and ``version`` (each committed version has exactly
one event, under one ``compaction_id``).

Finding those leftovers needs a global index, like the job index (:mod:`jobs`): a sorted
set of conversations, scored by when to look (epoch ms). It is written *before* the
commit (``expect``), so a crash anywhere after the commit leaves an index entry to find
it; an entry whose hash turns out empty is simply removed. A sweeper claims an entry by
moving its score to the end of a lease (the same script as the job index), so two
sweepers do not publish the same leftovers at once, and removes it only if its lease
still stands, so an entry a new compaction re-armed meanwhile stays.
"""

from __future__ import annotations

import logging
import time

from compaction_worker.runtime.publisher import Publisher
from compaction_worker.state.jobs import CLAIM_SCRIPT, UNINDEX_SCRIPT
from compaction_worker.state.keys import outbox_index_key
from compaction_worker.state.store import Store, as_text

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


def pack(topic: str, payload: bytes) -> bytes:
    """An outbox value: the topic, a newline, the event bytes (JSON, so no raw newline before it)."""
    return topic.encode() + b"\n" + payload


def unpack(value: bytes | str) -> tuple[str, bytes]:
    raw = value.encode() if isinstance(value, str) else value
    topic, _, payload = raw.partition(b"\n")
    return topic.decode(), payload


class Outbox:
    """Arms, delivers and relays the events that commits leave in a conversation's outbox."""

    def __init__(self, store: Store, publish: Publisher, grace_seconds: float) -> None:
        self.store = store
        self.redis = store.redis
        self.publish = publish
        self.index = outbox_index_key(store.prefix)
        self.grace_ms = max(1000, int(grace_seconds * 1000))
        self._claim = self.redis.register_script(CLAIM_SCRIPT)
        self._unindex = self.redis.register_script(UNINDEX_SCRIPT)

    async def expect(self, conversation_id: str) -> int:
        """Index the conversation before a commit that may leave an event; returns the score set.

        A live worker delivers well within ``grace_seconds``; only then may a sweeper step in.
        """
        score = _now_ms() + self.grace_ms
        await self.redis.zadd(self.index, {conversation_id: score})
        return score

    async def deliver(self, conversation_id: str, field: str, score: int) -> None:
        """Publish one event left by our own commit, then forget it (and the index entry, if it was the last)."""
        key = self.store.keys(conversation_id).outbox
        value = await self.redis.hget(key, field)
        if value is None:  # a sweeper was faster
            return
        await self.publish(*unpack(value), conversation_id.encode())
        await self.redis.hdel(key, field)
        if await self.redis.hlen(key) == 0:
            await self._unindex(keys=[self.index], args=[conversation_id, score])

    async def relay(self, limit: int = 100) -> int:
        """Publish what dead workers left behind; returns how many events were published."""
        now = _now_ms()
        due = await self.redis.zrangebyscore(self.index, "-inf", now, start=0, num=limit)
        published = 0
        for raw in due:
            cid = as_text(raw)
            # Half a millisecond off the grid ``expect`` scores on: a re-armed entry never looks like our lease.
            lease = now + self.grace_ms + 0.5
            if await self._claim(keys=[self.index], args=[cid, now, lease]) is None:
                continue  # another sweeper, or a new compaction re-armed it
            key = self.store.keys(cid).outbox
            for field, value in (await self.redis.hgetall(key)).items():
                await self.publish(*unpack(value), cid.encode())
                await self.redis.hdel(key, field)
                published += 1
                log.warning("published a completion event of %s that its worker left behind", cid)
            if await self.redis.hlen(key) == 0:
                await self._unindex(keys=[self.index], args=[cid, lease])
        return published
