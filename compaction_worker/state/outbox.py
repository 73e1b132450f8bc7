"""The outbox: a committed compaction's ``compaction.completed`` event is never lost.

The commit script writes the event into the conversation's ``outbox`` hash, in the same
atomic step as the new history; it is published right after, under the run's lock, or by any
worker's relay (which takes that lock) if its worker died first (at least once;
docs/design.md, "The outbox").
"""

from __future__ import annotations

import logging

from compaction_worker.contracts.events import Publish
from compaction_worker.conversation.keys import outbox_index_key
from compaction_worker.state.index import ShardedIndex, Sweep, now_ms
from compaction_worker.state.lock import Busy, Locks
from compaction_worker.state.scripts import as_text
from compaction_worker.state.store import Store
from compaction_worker.state.wake import Wakes

log = logging.getLogger(__name__)


def pack(topic: str, payload: bytes) -> bytes:
    """An outbox value: the topic, a newline, the event bytes (JSON, so no raw newline before it)."""
    return topic.encode() + b"\n" + payload


def event_field(version: int, compaction_id: str) -> str:
    """The outbox field of a commit's event: its version first, so that fields sort in commit order."""
    return f"{version:012d}-{compaction_id}"


def unpack(value: bytes | str) -> tuple[str, bytes]:
    raw = value.encode() if isinstance(value, str) else value
    topic, _, payload = raw.partition(b"\n")
    return topic.decode(), payload


class Outbox:
    """Arms, delivers and relays the events that commits leave in a conversation's outbox.

    The index entry is written before the commit (``expect``), so a crash anywhere after it
    leaves an entry to find the event by. Whoever publishes holds the conversation's lock:
    the committing run (``deliver``), or a relay that took it (a busy lock is looked at again
    when it would expire). The entry goes when the hash is empty: removed, then the hash read
    again, so that an event written meanwhile keeps an entry.
    """

    def __init__(
        self,
        store: Store,
        publish: Publish,
        locks: Locks,
        grace_seconds: float,
        *,
        shards: int,
        wakes: Wakes | None = None,
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.publish = publish
        self.locks = locks
        self.index = ShardedIndex(store.redis, outbox_index_key(store.prefix), shards, wakes=wakes)
        self.grace_ms = max(1000, int(grace_seconds * 1000))

    async def expect(self, conversation_id: str) -> None:
        """Index the conversation before a commit that may leave an event.

        A live worker delivers well within ``grace_seconds``; only then does a relay look.
        """
        await self.index.add(conversation_id, now_ms() + self.grace_ms)

    async def deliver(self, conversation_id: str, field: str) -> None:
        """Publish the event our own commit left, after any earlier one still waiting, then forget them.

        Called under the lock of the run that committed. An earlier commit's event waits here
        when its publish failed (the broker was down): sent first, the conversation's events
        keep the order of its versions (``event_field``). The index entry goes with the last event.
        """
        key = self.store.keys(conversation_id).outbox
        pending = {as_text(f): v for f, v in (await self.redis.hgetall(key)).items()}
        if field not in pending:  # our lock ran out and a relay took the conversation over
            return
        for earlier in sorted(f for f in pending if f <= field):
            await self.publish(*unpack(pending[earlier]), conversation_id.encode())
            await self.redis.hdel(key, earlier)
        await self._unindex(conversation_id)

    async def relay(self, limit: int = 100) -> Sweep:
        """Publish what dead workers left in the outboxes that are due; returns how many events, and when to look next."""
        scan = await self.index.scan(limit, now_ms())
        published = 0
        for cid in scan.due:
            published += await self._relay(cid)
        return Sweep(published, scan.next_ms)

    async def relay_due(self, conversation_id: str) -> float | None:
        """Publish one conversation's leftovers if its entry is due; else when it will be (ms), None if gone."""
        score = await self.index.score(conversation_id)
        if score is None or score > now_ms():
            return score
        await self._relay(conversation_id)
        return None

    async def _relay(self, cid: str) -> int:
        keys = self.store.keys(cid)
        lease = await self.locks.acquire(cid, keys)
        if isinstance(lease, Busy):  # a run is committing (or relaying): it delivers, or its lock runs out
            log.debug("%s is locked by another run; its outbox is looked at again when the lock expires", cid)
            await self.index.add(cid, lease.until_ms, existing_only=True, later_only=True)
            return 0
        published = 0
        async with self.locks.kept(lease, keys):
            pending = {as_text(f): v for f, v in (await self.redis.hgetall(keys.outbox)).items()}
            for field in sorted(pending):  # in version order (``event_field``)
                await self.publish(*unpack(pending[field]), cid.encode())
                await self.redis.hdel(keys.outbox, field)
                published += 1
                log.warning("published a completion event of %s that its worker left behind", cid)
            await self._unindex(cid)
        return published

    async def _unindex(self, cid: str) -> None:
        """Remove the entry, then read the hash again: an event still there keeps an entry."""
        await self.index.remove(cid)
        if await self.redis.hlen(self.store.keys(cid).outbox):
            await self.index.add(cid, now_ms() + self.grace_ms)
