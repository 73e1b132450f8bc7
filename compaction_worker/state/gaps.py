"""Turns held behind a sequence gap: the held-turn hash, its index, and expiry.

A turn that arrives ahead of a missing ``turn_seq`` waits in its conversation's ``pending``
hash until the missing turn arrives; after ``worker.gap_timeout_seconds`` a sweep sends it
to the dead-letter topic, holding the conversation's lock (the one lease a conversation has:
state/lock.py) while it does. Expiry never gives up on the missing turn, and touches nothing
but the held turns (docs/design.md, "Sequence gaps").
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from compaction_worker.contracts.events import BadEventError, DeadLetterReason
from compaction_worker.conversation.keys import gaps_index_key
from compaction_worker.state.index import ShardedIndex
from compaction_worker.state.lock import Busy, Locks
from compaction_worker.state.scripts import Script
from compaction_worker.state.store import Store
from compaction_worker.state.wake import Wakes

log = logging.getLogger(__name__)


HELD_LUA = "held.lua"
"""The library that reads a held turn's stored form in Lua (the format below)."""

# A held turn is stored as ``<held_ms>:<fp>:<raw>`` (``fp``: the turn's fingerprint, 32 hex
# digits). A held turn was a JSON object: its own first byte is never a digit, nor a hex digit.
_HELD_PREFIX = re.compile(rb"(\d+):")
_HELD_FINGERPRINT = re.compile(rb"([0-9a-f]{32}):")


@dataclass(frozen=True, slots=True)
class HeldTurn:
    """A turn held behind a gap: its original bytes and when it was held."""

    turn_seq: int
    held_ms: int
    raw: bytes
    fingerprint: str
    """The turn's content fingerprint."""

    @property
    def stamp(self) -> str:
        """What its stored form starts with: the hold time and the fingerprint tell this copy from any other."""
        return f"{self.held_ms}:{self.fingerprint}:"


def held_value(raw: bytes, held_ms: int, fingerprint: str) -> bytes:
    """The stored form of a held turn."""
    if re.fullmatch(r"[0-9a-f]{32}", fingerprint) is None:
        raise ValueError(f"not a turn fingerprint: {fingerprint!r}")
    return b"%d:%s:%s" % (held_ms, fingerprint.encode(), raw)


def parse_held(turn_seq: int, value: bytes | str) -> HeldTurn:
    """Read a stored held turn (ValueError for a value :func:`held_value` did not write)."""
    data = value.encode() if isinstance(value, str) else value
    match = _HELD_PREFIX.match(data)
    if match is None:
        raise ValueError(f"not a held turn (no hold time): {data[:40]!r}")
    body = data[match.end() :]
    found = _HELD_FINGERPRINT.match(body)
    if found is None:
        raise ValueError(f"not a held turn (no fingerprint): {body[:40]!r}")
    return HeldTurn(turn_seq, int(match.group(1)), body[found.end() :], found.group(1).decode())


@dataclass(frozen=True, slots=True)
class ExpiredTurn:
    """A held turn a sweep sends to the dead-letter topic, with the reason and its original bytes."""

    conversation_id: str
    turn_seq: int
    error: BadEventError
    raw: bytes

    @property
    def detail(self) -> str:
        return self.error.detail


DeadLetter = Callable[[bytes, str, int, BadEventError], Awaitable[None]]
"""Publishes a held turn (its bytes, conversation, seq and reason) to the dead-letter topic
(runtime/deadletters.py: ``DeadLetters.held``); raises if it could not."""


class GapIndex:
    """Holds turns behind a gap, indexes the conversations that hold any, and expires them.

    The index lives outside the conversations' hash slots, so its writes are ordered
    instead: a held turn always has an index entry; an entry without held turns is
    harmless (the next sweep that reaches it drops it).
    """

    def __init__(
        self,
        store: Store,
        timeout_seconds: float,
        *,
        locks: Locks,
        shards: int,
        batch: int = 100,
        wakes: Wakes | None = None,
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.timeout_ms = int(timeout_seconds * 1000)
        # Scored by hold time, an entry is due (and announced) a timeout later.
        self.index = ShardedIndex(
            store.redis, gaps_index_key(store.prefix), shards, wakes=wakes, due_after_ms=self.timeout_ms
        )
        self.next_due_ms: float | None = None
        """When the next held turn times out (epoch ms), as the last :meth:`expire` saw it; None: none held."""
        self.locks = locks
        self.batch = batch
        self.expired = 0
        self._drop = Script(self.redis, HELD_LUA, "gaps_drop.lua")
        self._oldest = Script(self.redis, HELD_LUA, "gaps_oldest.lua")

    def _key(self, conversation_id: str) -> str:
        return self.store.keys(conversation_id).pending

    async def indexed(self, conversation_id: str, held_ms: int) -> None:
        """Index a conversation that holds a turn since ``held_ms`` (the per-turn script holds it).

        After the hash, on every delivery (a crash between the two is repaired by the
        redelivery); LT keeps the oldest hold time.
        """
        await self.index.add(conversation_id, held_ms, lower_only=True)

    async def held_turn(self, conversation_id: str, turn_seq: int) -> HeldTurn | None:
        """The held turn with this seq, with its hold time and fingerprint, if there is one."""
        value = await self.redis.hget(self._key(conversation_id), str(turn_seq))
        return None if value is None else parse_held(turn_seq, value)

    async def held_turns(self, conversation_id: str) -> list[HeldTurn]:
        """Every turn held behind a gap, by ascending seq."""
        raw = await self.redis.hgetall(self._key(conversation_id))
        return sorted((parse_held(int(seq), value) for seq, value in raw.items()), key=lambda h: h.turn_seq)

    async def drop(self, conversation_id: str, turn_seq: int) -> None:
        """Forget a held turn (the turn handler dead-lettered it on release)."""
        await self.redis.hdel(self._key(conversation_id), str(turn_seq))

    async def reindex(self, conversation_id: str) -> None:
        """Score a conversation by its oldest held turn, or drop it from the index if none is held."""
        pending = self._key(conversation_id)
        oldest = await self._oldest([pending])
        if oldest is None:
            await self.index.remove(conversation_id)
            # A turn held between the read and the removal must not be left unindexed.
            oldest = await self._oldest([pending])
            if oldest is None:
                return
        await self.index.add(conversation_id, int(oldest))

    async def expire(self, dead_letter: DeadLetter, now: float | None = None) -> list[ExpiredTurn]:
        """Dead-letter every turn held longer than the timeout; returns those sent.

        Each conversation's are sent under its lock, one by one, and each is forgotten once
        sent: a publish error propagates (the sweeper logs it) and leaves that turn and the
        rest held, for the next sweep. A conversation whose lock another holds (a compaction,
        another sweep) is looked at again when that lock runs out. Safe on every worker at
        once: the lock lets one sweep at a time send a conversation's turns. A held copy of a
        turn stored meanwhile is dropped here, unsent.
        """
        now_ms = int((time.time() if now is None else now) * 1000)
        scan = await self.index.scan(self.batch, now_ms - self.timeout_ms)
        self.next_due_ms = None if scan.next_ms is None else scan.next_ms + self.timeout_ms
        expired: list[ExpiredTurn] = []
        for cid in scan.due:
            keys = self.store.keys(cid)
            lease = await self.locks.acquire(cid, keys)
            if isinstance(lease, Busy):  # due again once that lock runs out, unless renewed
                await self.index.add(cid, lease.until_ms - self.timeout_ms, existing_only=True)
                continue
            async with self.locks.kept(lease, keys):
                expired += await self._expire(cid, now_ms, dead_letter)
            await self.reindex(cid)
        return expired

    async def held_count(self) -> int:
        """How many conversations hold turns behind a gap (as far as the index knows)."""
        return await self.index.count()

    async def _expire(self, cid: str, now_ms: int, dead_letter: DeadLetter) -> list[ExpiredTurn]:
        """Under the conversation's lock: send its expired held turns, forgetting each once sent."""
        due = [h for h in await self.held_turns(cid) if h.held_ms <= now_ms - self.timeout_ms]
        if not due:
            return []
        last_seq = (await self.store.meta(cid)).last_seq
        sent: list[ExpiredTurn] = []
        for held in due:
            error: BadEventError | None = None
            if held.turn_seq > last_seq:
                waited = (now_ms - held.held_ms) / 1000
                error = BadEventError(
                    DeadLetterReason.SEQUENCE_GAP, _detail(cid, held.turn_seq, waited, last_seq), cid
                )
            else:
                # Held by a worker that lost a race with the append of this very seq (a rebalance
                # overlap): it is stored, so this copy is a duplicate, unless its content differs.
                stored = await self.store.fingerprint(cid, held.turn_seq)
                if stored is not None and held.fingerprint != stored:
                    error = conflicting_duplicate(cid, held.turn_seq, held.fingerprint, stored)
                else:
                    log.info(
                        "turn %s of %s was applied meanwhile; dropping its held copy", held.turn_seq, cid
                    )
            if error is not None:
                await dead_letter(held.raw, cid, held.turn_seq, error)
                sent.append(ExpiredTurn(cid, held.turn_seq, error, held.raw))
                self.expired += 1
            # Only the copy read: one held since (after a gap filled and a turn came again) stays.
            await self._drop([self._key(cid)], seq=str(held.turn_seq), stamp=held.stamp)
        return sent

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
