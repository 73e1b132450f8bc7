"""What the state tests share: messages to append, an append that returns its status, a chunk."""

from __future__ import annotations

import time

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.state.appends import AppendStatus, NewMessage
from compaction_worker.state.gaps import GapIndex, held_value
from compaction_worker.state.store import Store

FP_A, FP_B = "a" * 32, "0123456789abcdef" * 2
"""Two turn fingerprints."""


def msg(text: str, role: str = "user", tokens: int = 10) -> NewMessage:
    return NewMessage({"role": role, "content": text}, tokens)


async def append(
    store: Store, cid: str, seq: int, *messages: NewMessage, fingerprint: str | None = None
) -> AppendStatus:
    """Append a turn to the conversation as stored; returns what the script did."""
    result = await store.append_turn(cid, seq, list(messages), {"model": "gpt-4o"}, fingerprint=fingerprint)
    return result.status


def chunk(first: Entry, last: Entry, text: str = "summary", tokens: int = 5) -> SummaryChunk:
    return SummaryChunk(
        id="c1",
        text=text,
        first_seq=first.seq,
        last_seq=last.seq,
        first_n=first.n,
        last_n=last.n,
        tokens=tokens,
        created_at="2026-01-01T00:00:00+00:00",
        model="test",
    )


async def hold(
    gaps: GapIndex,
    conversation_id: str,
    turn_seq: int,
    raw: bytes,
    now: float | None = None,
    *,
    fingerprint: str | None = None,
) -> bool:
    """Hold a turn behind a gap as the per-turn script does (the held form, the meta's ``held``
    flag, the index at the hold time ``now``), without the turns before it; False if that seq was
    already held (the first hold is kept). ``fingerprint``: the turn's, from ``raw`` when not given."""
    at = int((time.time() if now is None else now) * 1000)
    keys = gaps.store.keys(conversation_id)
    fingerprint = fingerprint or TurnEvent.model_validate_json(raw).fingerprint()
    async with gaps.redis.pipeline(transaction=True) as pipe:
        pipe.hsetnx(keys.pending, str(turn_seq), held_value(raw, at, fingerprint))
        pipe.hset(keys.meta, "held", "1")
        added, _ = await pipe.execute()
    await gaps.indexed(conversation_id, at)
    return bool(added)
