"""A conversation's transcript and effective history in Redis: append, read, replace.

An append costs O(new messages), and stores each message once: in the transcript, whose
records from the meta's ``tail`` are the effective history's verbatim tail, after the entries
the last compaction (or rewind, or pin) wrote to the entries list. The replace script that
commits a compaction (or a rewind, restore.py) keeps every entry appended while it ran
(docs/design.md, invariants 1 and 3).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compaction_worker.contracts.events import ContextStatus
from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryChunk
from compaction_worker.conversation.keys import ConversationKeys, conversation_keys
from compaction_worker.conversation.meta import Meta, read_meta, write_fields
from compaction_worker.errors import StaleFenceError
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script, as_text


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent read of a conversation: metadata plus its effective history."""

    meta: Meta
    history: EffectiveHistory
    chunk_tokens: int = field(default=0)
    listed: int = 0
    """How many of the history's entries the entries list holds: the rest are the transcript's."""

    @property
    def entry_count(self) -> int:
        return len(self.history.entries)

    def in_transcript(self, entries: Sequence[Entry]) -> int:
        """How many of ``entries``' last ones are this snapshot's last ones as the transcript holds
        them (unedited, in order): a commit leaves those where they are (:meth:`Store.commit`)."""
        tail = self.history.entries[self.listed :]
        kept = 0
        while kept < min(len(tail), len(entries)) and entries[-1 - kept] == tail[-1 - kept]:
            kept += 1
        return kept


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A committed replacement of the history: the new version and the token total after it."""

    version: int
    history_tokens: int
    appended_during: int


def snapshot_of(
    meta: Meta,
    raw_chunks: Sequence[bytes | str],
    raw_listed: Sequence[bytes | str],
    raw_tail: Sequence[bytes | str] = (),
) -> Snapshot:
    """A snapshot from the stored meta, chunks and entries: the entries list, then the
    transcript's records from the meta's ``tail`` (:meth:`Store.snapshot`)."""
    chunks = tuple(SummaryChunk.from_json(c) for c in raw_chunks)
    entries = tuple(Entry.from_json(e) for e in (*raw_listed, *raw_tail))
    history = EffectiveHistory(
        chunks=chunks,
        entries=entries,
        version=meta.version,
        system_prompt=meta.system_prompt,
        tools=meta.tools,
    )
    return Snapshot(meta, history, chunk_tokens=sum(c.tokens for c in chunks), listed=len(raw_listed))


@dataclass(frozen=True, slots=True)
class PinWrite:
    """What :meth:`Store.set_pinned` did: nothing when a summary replaced some of the messages
    (``summarized``), else it set the flag of those that had the other one (``changed``)."""

    summarized: tuple[int, ...]
    changed: tuple[int, ...]


class Store:
    """Conversation state in Redis; every multi-key write is one atomic script."""

    def __init__(self, redis: RedisClient, prefix: str, retention_seconds: int | None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.retention_ms = (retention_seconds or 0) * 1000
        self._replace = Script(redis, "push.lua", "expiry.lua", "replace.lua")
        self._pin = Script(redis, "push.lua", "expiry.lua", "pin.lua")
        self._next_seq = Script(redis, "expiry.lua", "sequence_next.lua")

    def keys(self, conversation_id: str) -> ConversationKeys:
        return conversation_keys(conversation_id, self.prefix)

    async def meta(self, conversation_id: str) -> Meta:
        """The conversation's metadata (all zero for an unknown conversation)."""
        return await read_meta(self.redis, self.keys(conversation_id).meta)

    async def set_meta(self, conversation_id: str, **fields: str | int | float) -> None:
        """Update metadata fields that no script owns (a no-op's size, a failure's backoff), bumping the revision."""
        await write_fields(self.redis, self.keys(conversation_id).meta, fields)

    async def next_turn_seq(self, conversation_id: str, *, at_least: int = 0) -> int:
        """The next unused turn seq (1 for a new conversation), for runtimes that do not track their own:
        one past the largest of the last seq handed out (the ``seq`` key), the last one stored and
        ``at_least`` (the last one the caller published, stored or not yet), so concurrent callers never
        get the same seq, and a counter that expired starts after the stored turns."""
        keys = self.keys(conversation_id)
        now = str(int(time.time() * 1000))
        return int(
            await self._next_seq(
                keys.lasting(keys.meta, keys.seq),
                now_ms=now,
                retention_ms=str(self.retention_ms),
                at_least=str(at_least),
            )
        )

    async def fingerprint(self, conversation_id: str, turn_seq: int) -> str | None:
        """The stored turn's content fingerprint; None when no turn ``turn_seq`` is stored."""
        value = await self.redis.hget(self.keys(conversation_id).fingerprints, str(turn_seq))
        return None if value is None else as_text(value)

    async def snapshot(self, conversation_id: str) -> Snapshot:
        """Read metadata, chunks and entries as one consistent view.

        The meta, the chunks and the entries list are read in one transaction; the verbatim
        tail appended since (the transcript's records from the meta's ``tail`` up to its message
        count) in a second round trip, only when there is one. The transcript is append-only, so
        those records are the ones the meta counted, whatever was appended or committed between.
        """
        keys = self.keys(conversation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.chunks, 0, -1)
            pipe.lrange(keys.entries, 0, -1)
            raw_meta, raw_chunks, raw_entries = await pipe.execute()
        meta = Meta.from_hash(raw_meta)
        if meta.msg_count <= meta.tail:
            return snapshot_of(meta, raw_chunks, raw_entries)
        tail = await self.redis.lrange(keys.transcript, meta.tail, meta.msg_count - 1)
        if len(tail) != meta.msg_count - meta.tail:  # deleted or expired since the first read: gone now
            return snapshot_of(Meta(), [], [])
        return snapshot_of(meta, raw_chunks, raw_entries, tail)

    async def set_pinned(self, conversation_id: str, ordinals: Sequence[int], pinned: bool) -> PinWrite:
        """Set the ``pinned`` flag of the history's messages ``ordinals``; the caller holds the lock.

        Says which the history no longer carries verbatim (a summary replaced them), and then
        writes nothing, and which of the others had another flag (only those change; none: nothing
        is written). A message appended since the last compaction is the transcript's, not the
        entries list's: the transcript's records up to the last such one move to the list,
        flagged, and the meta's ``tail`` moves past them (lua/pin.lua, which writes nothing if
        the history changed since this read it: StaleFenceError).
        """
        keys = self.keys(conversation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lrange(keys.entries, 0, -1)
            pipe.hgetall(keys.meta)
            raw, stored = await pipe.execute()
        meta = Meta.from_hash(stored)
        tail = meta.tail
        at = {entry.n: (i, entry) for i, entry in enumerate(map(Entry.from_json, raw)) if not entry.synthetic}
        gone = tuple(n for n in ordinals if n <= tail and n not in at)
        if gone:
            return PinWrite(gone, ())
        last = max(ordinals, default=0)
        # The transcript is never rewritten: these records stay what they are.
        moved = await self.redis.lrange(keys.transcript, tail, last - 1) if last > tail else []
        records = [Entry.from_json(r) for r in moved]
        flags = {n: bool(e.message.get("pinned")) for n, (_, e) in at.items()}
        flags |= {e.n: bool(e.message.get("pinned")) for e in records}
        changed = tuple(n for n in ordinals if flags.get(n, False) != pinned)
        if not changed:
            return PinWrite((), ())
        flagged = [
            text
            for n in ordinals
            if n in at
            for text in (str(at[n][0]), _flagged(at[n][1], pinned).to_json())
        ]
        written = await self._pin(
            [keys.meta, keys.entries],
            {
                "set": flagged,
                "moved": [(_flagged(e, pinned) if e.n in ordinals else e).to_json() for e in records],
            },
            version=str(meta.version),
            tail=str(tail),
            listed=str(len(raw)),
            moved_to=str(max(last, tail)),
        )
        if not int(written):
            raise StaleFenceError(f"pin refused for {conversation_id}: its history changed meanwhile")
        return PinWrite((), changed)

    async def transcript(self, conversation_id: str, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Transcript records (``conversation.apply.encode_records`` says their form) in order (list indexes, inclusive)."""
        raw = await self.redis.lrange(self.keys(conversation_id).transcript, start, end)
        return [json.loads(r) for r in raw]

    async def turn_ordinals(self, conversation_id: str, turn_seq: int) -> list[int]:
        """The transcript ordinals of turn ``turn_seq``'s messages (none if it is not stored).

        The transcript holds the turns in seq order, message ``n`` at index ``n - 1``: a binary
        search finds the turn's first record in O(log n) reads of one record each, and only the
        turn's own records are read after it.
        """
        key = self.keys(conversation_id).transcript
        low, high = 0, int(await self.redis.llen(key))
        while low < high:
            middle = (low + high) // 2
            if _record_seq(await self.redis.lindex(key, middle)) < turn_seq:
                low = middle + 1
            else:
                high = middle
        ordinals: list[int] = []
        while True:
            batch = await self.redis.lrange(key, low + len(ordinals), low + len(ordinals) + 15)
            for raw in batch:
                if _record_seq(raw) != turn_seq:
                    return ordinals
                ordinals.append(low + len(ordinals) + 1)
            if len(batch) < 16:
                return ordinals

    async def originals(self, conversation_id: str, ordinals: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Transcript messages by ordinal (message ``n`` is at list index ``n - 1``), in one round trip."""
        if not ordinals:
            return {}
        key = self.keys(conversation_id).transcript
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in ordinals:
                pipe.lindex(key, n - 1)
            raw = await pipe.execute()
        found: dict[int, dict[str, Any]] = {}
        for n, record in zip(ordinals, raw, strict=True):
            if record is not None and (data := json.loads(record))["n"] == n:
                found[n] = data["m"]
        return found

    async def compactions(self, conversation_id: str) -> list[dict[str, Any]]:
        """The log of committed compactions, oldest first."""
        raw = await self.redis.lrange(self.keys(conversation_id).compactions, 0, -1)
        return [json.loads(r) for r in raw]

    async def commit(
        self,
        conversation_id: str,
        *,
        fence: int,
        lock_token: str,
        expected_version: int,
        consumed: int,
        chunks: Sequence[SummaryChunk],
        entries: Sequence[Entry],
        tokens: int,
        status: ContextStatus,
        record: Mapping[str, Any],
        outbox: tuple[str, bytes] | None = None,
        recount: bool = False,
        writer: str = "commit",
        floor_tokens: int = 0,
        compacted_seq: int = 0,
    ) -> CommitResult:
        """Replace the history as a new version: the first ``consumed`` entries and all chunks, keeping later appends.

        The fenced ``writer`` is a compaction's commit or a rewind (restore.py). ``tokens`` is
        the change in history tokens, or with ``recount`` the tokens of the new chunks and
        entries (the total is then recomputed with the entries appended since). ``record`` goes
        to the compaction log. ``outbox`` is an event (field, payload) stored with the commit,
        in the same script: it is published afterwards and, if the worker dies first, by
        another (outbox.py). ``floor_tokens`` and ``compacted_seq`` are the threshold rule's marks
        (conversation/meta.py); a rewind leaves them 0. Raises StaleFenceError when the fence moved, the lock expired, or
        another compaction committed since the snapshot: nothing is written then.
        """
        keys = self.keys(conversation_id)
        header: dict[str, Any] = {
            "fence": str(fence),
            "lock_token": lock_token,
            "expected_version": expected_version,
            "consumed": consumed,
            "tokens": str(tokens),
            "recount": recount,
            "status": status.value,
            "now": repr(time.time()),
            "floor_tokens": floor_tokens,
            "compacted_seq": compacted_seq,
        }
        lists: dict[str, Sequence[str | bytes]] = {
            "chunks": [c.to_json() for c in chunks],
            "entries": [e.to_json() for e in entries],
            "record": [json.dumps(dict(record), separators=(",", ":"), ensure_ascii=False, default=str)],
            "outbox": outbox or (),
        }
        reply = await self._replace(
            [
                keys.meta,
                keys.chunks,
                keys.entries,
                keys.compactions,
                keys.lock,
                keys.fence,
                keys.outbox,
                keys.transcript,
            ],
            lists,
            **header,
        )
        outcome = as_text(reply[0])
        if outcome != "committed":
            raise StaleFenceError(f"{writer} refused for {conversation_id}: {outcome}")
        return CommitResult(
            version=int(reply[1]), history_tokens=int(reply[2]), appended_during=int(reply[3])
        )

    async def delete(self, conversation_id: str) -> int:
        """Remove every key of a conversation (operator command); returns keys removed."""
        return int(await self.redis.delete(*self.keys(conversation_id).all()))


_SEQ = re.compile(rb'^\{"n":\d+,"seq":(\d+),')


def _record_seq(raw: bytes | str | None) -> int:
    """A transcript record's turn seq, read from its head (encode_records writes ``n`` and ``seq`` first)."""
    if raw is None:
        return 0
    data = raw.encode() if isinstance(raw, str) else raw
    found = _SEQ.match(data)
    return int(found.group(1)) if found else int(json.loads(data)["seq"])


def _flagged(entry: Entry, pinned: bool) -> Entry:
    return replace(entry, message={**entry.message, "pinned": pinned})
