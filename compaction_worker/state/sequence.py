"""The turn-seq counter of a conversation, for runtimes that do not track ``turn_seq`` themselves.

One string per conversation (``seq``, under its hash tag) holds the last seq handed out; the
script takes the larger of it and the stored ``last_seq``, so concurrent callers never get
the same seq and a counter that expired (retention) or never existed starts after the
stored turns.
"""

from __future__ import annotations

import time

from compaction_worker.state.connection import RedisClient
from compaction_worker.state.keys import conversation_keys
from compaction_worker.state.scripts import Script


class TurnSequence:
    """Hands out each conversation's turn seqs, atomically."""

    def __init__(self, redis: RedisClient, prefix: str, retention_seconds: int | None) -> None:
        self.prefix = prefix
        self.retention_ms = (retention_seconds or 0) * 1000
        self._next = Script(redis, "expiry.lua", "sequence_next.lua")

    async def next(self, conversation_id: str) -> int:
        """The next unused turn seq of the conversation (1 for a new one)."""
        keys = conversation_keys(conversation_id, self.prefix)
        lasting = keys.lasting(keys.meta, keys.seq)
        return int(
            await self._next(
                lasting, now_ms=str(int(time.time() * 1000)), retention_ms=str(self.retention_ms)
            )
        )
