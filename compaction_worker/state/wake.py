"""Wake-ups: when to look at an index entry, announced to the workers that wait for work.

The indexes (index.py) are the truth about what is due, but an idle worker does not poll
them. Every write that arms an entry also announces it here: one sorted set
``{<prefix>:wake}``, member ``<index>:<conversation id>``, scored by when to look (epoch ms;
``LT`` keeps the earliest). A worker with room blocks on it (``BZPOPMIN``) and keeps what it
pops as a timer. A wake-up is only a hint: whoever acts on one reads the index first, and a
wake-up lost with a dead worker is found by the slow safety sweep (docs/design.md, "Waking").
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction_worker.conversation.keys import wake_key
from compaction_worker.settings import DEFAULT_PREFIX
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import as_text


@dataclass(frozen=True, slots=True)
class Wake:
    """Look at a conversation's entry in the index named ``kind`` at ``at_ms`` (epoch ms)."""

    kind: str
    conversation_id: str
    at_ms: float

    @property
    def member(self) -> str:
        return f"{self.kind}:{self.conversation_id}"


class Wakes:
    """Announces when to look at index entries; hands them to one waiting worker each."""

    def __init__(self, redis: RedisClient, prefix: str = DEFAULT_PREFIX) -> None:
        self.redis = redis
        self.key = wake_key(prefix)

    async def announce(self, *wakes: Wake) -> None:
        """Announce these looks (an earlier announcement of the same entry wins)."""
        if wakes:
            await self.redis.zadd(self.key, {w.member: w.at_ms for w in wakes}, lt=True)

    async def next(self, wait_seconds: float) -> Wake | None:
        """The earliest announcement, taken from the set; None after ``wait_seconds`` without one.

        Blocks one connection of the client's pool meanwhile (a cluster client's, on the
        node that owns the key): ``wait_seconds`` stays well under the client's socket timeout.
        """
        got = await self.redis.bzpopmin(self.key, wait_seconds)
        if got is None:
            return None
        _, member, score = got
        kind, _, cid = as_text(member).partition(":")
        return Wake(kind, cid, float(score))
