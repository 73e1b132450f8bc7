"""What the state tests share: messages to append, an append as given, a chunk, a hold."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.conversation.apply import (
    AppendReply,
    Appends,
    AppendStatus,
    NewMessage,
    TurnWrite,
    first_fields,
)
from compaction_worker.conversation.meta import JobRequest, recorded
from compaction_worker.state.gaps import GapIndex, held_value
from compaction_worker.state.scripts import encode
from compaction_worker.state.store import Store

FP_A, FP_B = "a" * 32, "0123456789abcdef" * 2
"""Two turn fingerprints."""


def msg(text: str, role: str = "user", tokens: int = 10) -> NewMessage:
    return NewMessage({"role": role, "content": text}, tokens)


async def append_turn(
    store: Store,
    cid: str,
    seq: int,
    messages: Sequence[NewMessage],
    meta_fields: Mapping[str, str | int | float] | None = None,
    *,
    request: JobRequest | None = None,
    fingerprint: str | None = None,
) -> AppendReply:
    """Store a turn as given (its messages' counts, the meta fields, a job request) through the
    store's write, on the meta as stored: the store's own contract, without the rest of the
    worker's decision (conversation/decide.py). ``fingerprint`` defaults to a digest of the messages."""
    meta = await store.meta(cid)
    if fingerprint is None:
        digest = hashlib.blake2b(digest_size=16)
        for message in messages:
            digest.update(b"\x1e" + (message.text or encode(message.message)).encode())
        fingerprint = digest.hexdigest()
    now = time.time()
    fields = {k: str(v) for k, v in (meta_fields or {}).items()}
    fields |= {
        "last_seq": str(seq),
        "msg_count": str(meta.msg_count + len(messages)),
        "history_tokens": str(meta.history_tokens + sum(m.tokens for m in messages)),
        "updated_at": repr(now),
    }
    if request is not None:  # as the worker decides it (conversation/decide.py)
        fields |= recorded(request, meta, now)[0]
    write = TurnWrite(
        seq=seq,
        messages=messages,
        first_n=meta.msg_count + 1,
        fields=fields | (first_fields(now) if meta.last_seq == 0 else {}),
        rev=meta.rev,
        now=now,
        fingerprint=fingerprint,
        first=meta.last_seq == 0,
    )
    return await write_turn(store, cid, write)


async def write_run(store: Store, cid: str, writes: Sequence[TurnWrite]) -> list[AppendReply]:
    """Store consecutive turns through the per-turn script (conversation/apply.py), over the store's Redis."""
    return await Appends(store.redis, store.prefix, store.retention_ms // 1000).apply(cid, writes)


async def write_turn(store: Store, cid: str, write: TurnWrite) -> AppendReply:
    """Store one turn: a run of one."""
    return (await write_run(store, cid, [write]))[0]


async def append(
    store: Store, cid: str, seq: int, *messages: NewMessage, fingerprint: str | None = None
) -> AppendStatus:
    """Append a turn to the conversation as stored; returns what the script did."""
    result = await append_turn(store, cid, seq, list(messages), {"model": "gpt-4o"}, fingerprint=fingerprint)
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
