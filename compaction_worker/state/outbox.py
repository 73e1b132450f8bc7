"""The outbox: a committed compaction's ``compaction.completed`` event is never lost.

The commit script writes the event into the conversation's ``outbox`` hash, in the same
atomic step as the new history; it is published right after, or by any worker's sweeper if
its worker died first (at least once; docs/design.md, "The outbox").
"""

from __future__ import annotations

import logging

from compaction_worker.runtime.publisher import Publisher
from compaction_worker.settings import DEFAULT_INDEX_SHARDS, DEFAULT_PREFIX
from compaction_worker.state.index import IndexStats, LeasedIndex, now_ms
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)


def outbox_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The outbox index's name (its buckets: index.bucket_keys): conversations that may have unpublished events.

    Scored by when to look (ms); also the single key of the versions before buckets.
    """
    return f"{prefix}:outbox"


def pack(topic: str, payload: bytes) -> bytes:
    """An outbox value: the topic, a newline, the event bytes (JSON, so no raw newline before it)."""
    return topic.encode() + b"\n" + payload


def event_field(version: int, compaction_id: str) -> str:
    """The outbox field of a commit's event: its version first, so that fields sort in commit order."""
    return f"{version:012d}-{compaction_id}"


def _text(field: bytes | str) -> str:
    return field.decode() if isinstance(field, bytes) else field


def unpack(value: bytes | str) -> tuple[str, bytes]:
    raw = value.encode() if isinstance(value, str) else value
    topic, _, payload = raw.partition(b"\n")
    return topic.decode(), payload


class Outbox:
    """Arms, delivers and relays the events that commits leave in a conversation's outbox.

    The index entry is written before the commit (``expect``), so a crash anywhere after it
    leaves an entry to find the event by; a sweeper claims an entry with a lease, and removes
    it only if its lease still stands.
    """

    def __init__(
        self, store: Store, publish: Publisher, grace_seconds: float, *, shards: int = DEFAULT_INDEX_SHARDS
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.publish = publish
        self.index = LeasedIndex(store.redis, outbox_index_key(store.prefix), shards)
        self.grace_ms = max(1000, int(grace_seconds * 1000))

    async def expect(self, conversation_id: str) -> int:
        """Index the conversation before a commit that may leave an event; returns the score set.

        A live worker delivers well within ``grace_seconds``; only then may a sweeper step in.
        """
        score = now_ms() + self.grace_ms
        await self.index.arm(conversation_id, score)
        return score

    async def deliver(self, conversation_id: str, field: str, score: int) -> None:
        """Publish the event our own commit left, after any earlier one still waiting, then forget them.

        An earlier commit's event waits here when its publish failed (the broker was down):
        sent first, the conversation's events keep the order of its versions (``event_field``).
        The index entry goes with the last event.
        """
        key = self.store.keys(conversation_id).outbox
        pending = {_text(f): v for f, v in (await self.redis.hgetall(key)).items()}
        if field not in pending:  # a sweeper was faster
            return
        for earlier in sorted(f for f in pending if f <= field):
            await self.publish(*unpack(pending[earlier]), conversation_id.encode())
            await self.redis.hdel(key, earlier)
        if await self.redis.hlen(key) == 0:
            await self.index.drop(conversation_id, score)

    async def relay(self, limit: int = 100) -> int:
        """Publish what dead workers left behind; returns how many events were published."""
        now = now_ms()
        published = 0
        for cid in await self.index.due(limit, now):
            # Half a millisecond off the grid ``expect`` scores on: a re-armed entry never looks like our lease.
            lease = now + self.grace_ms + 0.5
            if not await self.index.claim(cid, now, lease):
                continue  # another sweeper, or a new compaction re-armed it
            key = self.store.keys(cid).outbox
            pending = {_text(f): v for f, v in (await self.redis.hgetall(key)).items()}
            for field in sorted(pending):  # in version order (``event_field``)
                await self.publish(*unpack(pending[field]), cid.encode())
                await self.redis.hdel(key, field)
                published += 1
                log.warning("published a completion event of %s that its worker left behind", cid)
            if await self.redis.hlen(key) == 0:
                await self.index.drop(cid, lease)
        return published

    async def stats(self) -> IndexStats:
        """Backlog: conversations that may have unpublished events, and the lowest score (ms)."""
        return await self.index.stats()
