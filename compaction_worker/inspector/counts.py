"""What the sawtooth needs of every transcript record, read once per conversation and then extended.

The sawtooth needs each record's turn, token count and time (``seq``, ``t``, ``at``), never its
message; re-reading a long transcript on every page view would cost Redis a reply the size of
all its messages and the page the parsing of them. The transcript is append-only, so what was
read stays true: a view reads only the records appended since, in the same round trip as the
last record it already read, which must be unchanged (else the conversation expired and began
again under its id, and everything is read anew). The first read goes in slices, so Redis never
builds one reply the size of the whole transcript.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from compaction_worker.state.store import Store

SLICE = 2000
"""Records per LRANGE when reading a transcript from its start."""
CAPACITY = 32
"""Conversations whose counts are kept (least recently viewed dropped first)."""


@dataclass(slots=True)
class _Counts:
    records: list[dict[str, Any]]
    """``{"seq", "t", "at"}`` per transcript record, in order."""
    last: bytes | str
    """The last record read, as stored: still there, unchanged, while the transcript only grew."""


class TranscriptCounts:
    """Per-record token counts of the conversations viewed, kept in the inspector's memory."""

    def __init__(self, store: Store, capacity: int = CAPACITY) -> None:
        self.store = store
        self.capacity = capacity
        self._kept: OrderedDict[str, _Counts] = OrderedDict()

    async def read(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every record's ``seq``, ``t`` and ``at`` (read only: shared with later views, do not change it)."""
        key = self.store.keys(conversation_id).transcript
        redis = self.store.redis
        kept = self._kept.pop(conversation_id, None)
        if kept is not None:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.lindex(key, len(kept.records) - 1)
                pipe.lrange(key, len(kept.records), -1)
                last, added = await pipe.execute()
            if last != kept.last:
                kept = None
        if kept is None:
            kept, added = _Counts([], b""), []
            while len(part := await redis.lrange(key, len(added), len(added) + SLICE - 1)) == SLICE:
                added.extend(part)
            added.extend(part)
        if added:
            kept.records.extend(light(json.loads(raw)) for raw in added)
            kept.last = added[-1]
        if kept.records:
            self._kept[conversation_id] = kept
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)
        return kept.records


def light(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its message."""
    return {"seq": int(record["seq"]), "t": int(record["t"]), "at": float(record["at"])}
