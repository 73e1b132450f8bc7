"""A turn's one write: the per-turn script (lua/turn.lua, the only definition of a turn's effect on
Redis), then the index entry of the job it made due. One turn is a run of one.

The decision (decide.py) computes every meta field an append changes from the meta the caller
knows, and sends that meta's revision with them: the script stores the turn only if the revision
is still the stored one, and otherwise writes nothing and returns the stored meta (``stale``). So
every decision stays in Python, in one place. Duplicates and holds behind a gap depend on the
stored sequence alone, so the script settles them whatever revision the caller knew.

A run (lua/turn_run.lua) is consecutive turns of one conversation in one call, each turn's
fields computed from the meta the turn before it leaves: the script decides them in order, and
stops after the first that is not appended (writing nothing for it but its hold), or after one
whose next turn is held behind a gap. A single turn is a run of one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from compaction_worker.conversation.keys import ConversationKeys, conversation_keys
from compaction_worker.conversation.meta import JobRequest, Meta, read_meta, recorded
from compaction_worker.errors import ConcurrentUpdateError
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import ShardedIndex
from compaction_worker.state.scripts import Pipeline, PositionalScript, Script, as_text, encode

TURN_LUA = ("push.lua", "expiry.lua", "held.lua", "conversation:turn.lua", "conversation:turn_run.lua")
"""The per-turn script: its libraries, then its loop over a call's turns (called by position:
scripts.PositionalScript)."""


def _named(keys: ConversationKeys) -> list[str]:
    """The keys a call names (lua/turn.lua's KEYS)."""
    return [keys.meta, keys.transcript, keys.entries, keys.pending, keys.fingerprints]


@lru_cache(maxsize=4096)
def _script_keys(conversation_id: str, prefix: str) -> tuple[str, ...]:
    """A conversation's :func:`_named` keys, built once while it is served (its turns come in a row)."""
    return tuple(_named(conversation_keys(conversation_id, prefix)))


def _lasting_prelude() -> str:
    """``LASTING`` for lua/turn.lua: the names of the conversation's other lasting keys (keys.py names
    each after its field, at the end of the key), which the script derives from the meta's key."""
    keys = conversation_keys("c")
    named = _named(keys)
    others = keys.lasting(*named)[len(named) :]
    return f"local LASTING = '{' '.join(key.rpartition(':')[2] for key in others)}'\n"


UNKNOWN_REV = -1
"""The revision to send when the caller knows no meta: an append is then ``stale``."""


@dataclass(slots=True)
class NewMessage:
    """A message to append, with its token count (computed once, by the caller)."""

    message: Mapping[str, Any]
    tokens: int
    text: str | None = None
    """``message`` as compact JSON, if the caller has it (``ChatMessage.to_json``): else encoded here."""


class AppendStatus(StrEnum):
    """What the per-turn script did with a turn."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    """The seq is stored with the same fingerprint."""
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    """The seq is stored with another fingerprint: the turn is not the one stored."""
    HELD = "held"
    """The turn is ahead of the next seq: it is held behind the gap (now, or since an earlier delivery)."""
    CONFLICTING_HELD = "conflicting_held"
    """A different turn with this seq is held behind a gap; it arrived first and is kept."""
    NEED_HELD = "need_held"
    """The turn is ahead of the next seq, and the caller, expecting none, sent no held form."""
    STALE = "stale"
    """The caller's meta revision is not the stored one: nothing was written."""


@dataclass(slots=True)
class TurnWrite:
    """One turn as the script takes it: what to store, and what the caller computed from which revision."""

    seq: int
    messages: Sequence[NewMessage]
    first_n: int
    """The ordinal of the first message: the message count the caller knew, plus one."""
    fields: Mapping[str, str]
    """The meta fields the append changes, as stored text (last_seq, msg_count and totals among
    them, and the job it records: meta.recorded)."""
    rev: int
    """The meta revision the fields were computed from (:data:`UNKNOWN_REV`: none)."""
    now: float
    fingerprint: str
    """The turn's content fingerprint (``TurnEvent.fingerprint``): a redelivery with another conflicts."""
    held: bytes | None = None
    """The turn's held form (state/gaps.py: ``held_value``), sent when the caller expects a gap."""
    first: bool = False
    """Whether this is the conversation's first append (its keys are created now)."""
    due: bool = False
    """Whether the job the fields record is to be indexed once they are stored (decide.py: ``AppendPlan.due``)."""


@dataclass(slots=True)
class AppendReply:
    """The script's answer."""

    status: AppendStatus
    last_seq: int
    """The stored last seq: the turn's own after an append, else the one the script found."""
    rev: int = 0
    """After an append: the meta's new revision."""
    next_held: bool = False
    """After an append: turn ``seq + 1`` is held; after a duplicate: turn ``last_seq + 1`` is."""
    job: bool = False
    """After a duplicate: a job is pending (indexed again: the crash may have come before its entry was written)."""
    kept: str | None = None
    """For a conflict: the fingerprint of the turn stored or held first."""
    meta: Meta | None = None
    """When stale: the stored meta."""


def first_fields(now: float) -> dict[str, str]:
    """The meta fields a conversation's first append writes, and no append after it."""
    return {"created_at": repr(now), "version": "0", "context_status": "full"}


def encode_records(seq: int, first_n: int, messages: Sequence[NewMessage], at: float) -> list[str]:
    """The transcript records of a turn, each message encoded once; each is its entry too.

    A record is ``{"n", "seq", "m", "at", "t"}``: ``t`` is the count the entry gets, so a rewind
    restores it exactly. The effective history's verbatim tail is read from these records
    (``Entry.from_json`` reads ``n``, ``seq``, ``m``, ``t`` and ``e``, absent: no edit), so a
    turn's messages are stored once, in the transcript, and not in the entries list as well
    (store.py; a test holds the two readings equal).
    """
    # A clock's time is finite: its repr is the JSON number (json.dumps took ~1 us a turn).
    stamp = repr(float(at))
    return [
        f'{{"n":{n},"seq":{seq},"m":{new.text or encode(new.message)},"at":{stamp},"t":{new.tokens}}}'
        for n, new in enumerate(messages, start=first_n)
    ]


def records_of(write: TurnWrite) -> list[str]:
    """A write's transcript records (:func:`encode_records`)."""
    return encode_records(write.seq, write.first_n, write.messages, write.now)


def turn_args(write: TurnWrite, retention_ms: int, records: Sequence[str]) -> list[str | bytes]:
    """One turn's arguments, by position (lua/turn.lua names them); ``records`` are its :func:`records_of`."""
    fields = [text for pair in write.fields.items() for text in pair]
    args: list[str | bytes] = [
        str(write.seq),
        str(write.rev + 1),
        str(write.rev),
        str(int(write.now * 1000)),
        str(retention_ms),
        write.fingerprint,
        "1" if write.first else "0",
        str(len(fields)),
        *fields,
        str(len(records)),
        *records,
    ]
    if write.held is not None:
        args.append(write.held)
    return args


def run_args(
    writes: Sequence[TurnWrite], retention_ms: int, records: Sequence[Sequence[str]]
) -> list[str | bytes]:
    """The script's arguments: the number of turns, then each turn's argument count and arguments."""
    args: list[str | bytes] = [str(len(writes))]
    for write, each in zip(writes, records, strict=True):
        one = turn_args(write, retention_ms, each)
        args += [str(len(one)), *one]
    return args


def replies_of(raw: Any) -> list[AppendReply]:
    """Read the script's reply: a line of text per turn, with the stored meta after a stale one."""
    text, stored = (raw[0], raw[1]) if isinstance(raw, list) else (raw, None)
    return [reply_of(line.split(" "), stored) for line in as_text(text).split("\n")]


def reply_of(words: Sequence[str], stored: Sequence[Any] | None = None) -> AppendReply:
    """Read one turn's reply line (its words), and the stored meta hash (flat) that goes with a stale one."""
    status, last_seq = AppendStatus(words[0]), int(words[1])
    match status:
        case AppendStatus.APPENDED:
            return AppendReply(status, last_seq, rev=int(words[2]), next_held=words[3] == "1")
        case AppendStatus.DUPLICATE:
            return AppendReply(status, last_seq, next_held=words[3] == "1", job=words[2] == "1")
        case AppendStatus.CONFLICTING_DUPLICATE | AppendStatus.CONFLICTING_HELD:
            return AppendReply(status, last_seq, kept=words[2])
        case AppendStatus.STALE:
            flat = stored or []
            return AppendReply(
                status, last_seq, meta=Meta.from_hash(dict(zip(flat[::2], flat[1::2], strict=True)))
            )
    return AppendReply(status, last_seq)


class Appends:
    """A conversation's turns written: the per-turn script, then the jobs index's entry of a job made due.

    The index's buckets live outside the conversation's slot (state/index.py), so the entry is
    written after the script, not in it: a crash between the two is repaired by the turn's
    redelivery, a duplicate whose job is pending (its entry is written again). On a single Redis
    the calls go through one :class:`Pipeline` (``pipeline``: concurrent calls share round trips).
    """

    def __init__(
        self, redis: RedisClient, prefix: str, retention_seconds: int | None, jobs: ShardedIndex | None = None
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.retention_ms = (retention_seconds or 0) * 1000
        self.jobs = jobs
        """The jobs index (None: entries are not written; the tests of the script alone)."""
        self.pipeline = Pipeline(redis)
        self._script = PositionalScript(redis, *TURN_LUA, prelude=_lasting_prelude(), pipeline=self.pipeline)

    def keys(self, conversation_id: str) -> list[str]:
        """The script's keys (lua/turn.lua names them)."""
        return list(_script_keys(conversation_id, self.prefix))

    async def apply(self, conversation_id: str, writes: Sequence[TurnWrite]) -> list[AppendReply]:
        """Store consecutive turns of one conversation in one script call: each turn's reply, in order,
        up to the first that is not appended, or the one after which a turn is held; then the job
        entry, if a turn made its job due or a duplicate found one pending."""
        records = [records_of(write) for write in writes]
        raw = await self._script(self.keys(conversation_id), run_args(writes, self.retention_ms, records))
        replies = replies_of(raw)
        if self.jobs is not None and any(
            (reply.status is AppendStatus.APPENDED and write.due) or reply.job
            for write, reply in zip(writes, replies, strict=False)
        ):
            await self.jobs.add(conversation_id, int(time.time() * 1000))
        return replies


REQUEST_TRIES = 3
"""Writes a request made outside a turn may try while other writers keep changing the meta."""


async def record_request(redis: RedisClient, key: str, request: JobRequest) -> bool:
    """Record a compaction request made outside a turn onto the meta hash ``key``, as a turn's is
    decided (meta.recorded) and written only onto the revision it was decided on; whether it is
    the job now. Such a request carries no instructions: a job it replaces hands its own on."""
    for _ in range(REQUEST_TRIES):
        meta = await read_meta(redis, key)
        fields, new = recorded(request, meta, time.time())
        if not fields:
            return new
        flat = [text for pair in fields.items() for text in pair]
        if await Script(redis, "conversation:meta_set.lua")([key], {"fields": flat}, rev=str(meta.rev)):
            return new
    raise ConcurrentUpdateError(
        f"{key}: the meta changed under every one of {REQUEST_TRIES} tries of a request"
    )
