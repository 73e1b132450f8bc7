"""The per-turn script's contract: one call decides and stores a run of turns (lua/turn.lua); one turn is a run of one.

The turn handler (runtime/turns.py) computes every meta field an append changes from the
meta it knows, and sends that meta's revision with them: the script stores the turn only if
the revision is still the stored one, and otherwise writes nothing and returns the stored
meta (``stale``). So every decision stays in Python, in one place. Duplicates and holds
behind a gap depend on the stored sequence alone, so the script settles them whatever revision
the caller knew. On a single Redis a plain append (the common case) is made without the
script, as the same writes in a transaction once a read under ``WATCH`` confirms it is one
(:class:`PlainAppend`): two round trips, and well under half the script's Redis CPU.

A run (lua/turn_run.lua) is consecutive turns of one conversation in one call, each turn's
fields computed from the meta the turn before it leaves: the script decides them in order, and
stops after the first that is not appended (writing nothing for it but its hold), or after one
whose next turn is held behind a gap. A single turn is a run of one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from compaction_worker.state.scripts import as_text, encode

TURN_LUA = ("push.lua", "expiry.lua", "held.lua", "turn.lua", "turn_run.lua")
"""The per-turn script: its libraries, then its loop over a call's turns (called by position:
scripts.PositionalScript)."""

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
    them, and the job it records: jobs.recorded)."""
    rev: int
    """The meta revision the fields were computed from (:data:`UNKNOWN_REV`: none)."""
    now: float
    fingerprint: str
    """The turn's content fingerprint (``TurnEvent.fingerprint``): a redelivery with another conflicts."""
    held: bytes | None = None
    """The turn's held form (gaps.held_value), sent when the caller expects a gap."""
    first: bool = False
    """Whether this is the conversation's first append (its keys are created now)."""


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
    """After a duplicate: a job is pending (index it: the crash may have come before its writer did)."""
    kept: str | None = None
    """For a conflict: the fingerprint of the turn stored or held first."""
    meta: Mapping[str, str] | None = None
    """When stale: the stored meta hash."""


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
        str(write.seq + 1),
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


@dataclass(slots=True)
class PlainAppend:
    """Turns whose append is a plain one, made as a transaction instead of the script when a read says so.

    Most stored turns are plain appends: the next seq, computed from the stored revision, no
    turn held. The script's work for those is a few writes, and on a single
    Redis running them through Lua costs two to four times what the same writes cost as
    commands (docs/performance.md, "Redis at agent pace"). So the turn path reads the meta
    under ``WATCH`` (:attr:`read`) and, if it shows a plain append, makes exactly the writes
    the script would (:meth:`writes_for`) in ``MULTI``/``EXEC``, answering as the script
    would (:meth:`reply`). Any other turn, or a meta that changed between the read and the
    ``EXEC`` (which then writes nothing), goes to the script, which decides as always.
    ``tests/state/test_store.py`` holds the two equal, key by key.
    """

    keys: Sequence[str]
    """The per-turn script's KEYS (lua/turn.lua): the meta first, then those its writes touch."""
    writes: Sequence[TurnWrite]
    records: Sequence[Sequence[str]]
    """Each write's transcript records (:func:`records_of`)."""
    retention_ms: int

    @classmethod
    def of(
        cls,
        keys: Sequence[str],
        writes: Sequence[TurnWrite],
        records: Sequence[Sequence[str]],
        retention_ms: int,
    ) -> PlainAppend | None:
        """The plain append of these consecutive writes, or None if the caller knows no meta. Nothing
        is built until a read confirms it (:meth:`writes_for`)."""
        first = writes[0]
        if first.rev == UNKNOWN_REV:  # the script answers with the meta
            return None
        for i, write in enumerate(writes):
            if write.seq != first.seq + i or write.rev != first.rev + i:
                return None
        return cls(keys, writes, records, retention_ms)

    @property
    def watched(self) -> str:
        """The meta hash: every writer of the conversation's state bumps its revision."""
        return self.keys[0]

    @property
    def read(self) -> tuple[str, ...]:
        return ("HMGET", self.keys[0], "rev", "last_seq", "expires_at", "held")

    def writes_for(self, stored: Sequence[Any]) -> tuple[tuple[str, ...], ...] | None:
        """The script's writes, if the meta read (``rev, last_seq, expires_at, held``) makes the
        turns plain appends: the transcript, the meta, the fingerprints, then the deadlines (lua/turn.lua, flush)."""
        first = self.writes[0]
        rev, last, deadline = (int(value or 0) for value in stored[:3])
        if stored[3] is not None or rev != first.rev or last != first.seq - 1:
            return None
        kept = deadline
        for write in self.writes:  # lua/expiry.lua, renewed
            now_ms = int(write.now * 1000)
            if self.retention_ms > 0 and kept - now_ms < self.retention_ms / 2:
                kept = now_ms + self.retention_ms
        meta, transcript, fingerprints = self.keys[0], self.keys[1], self.keys[4]
        pushed = [record for turn in self.records for record in turn]
        merged = {"rev": str(rev + len(self.writes))}
        fingerprinted: list[str] = []
        for write in self.writes:  # a field a later turn writes again: its value is the one kept
            merged |= write.fields
            fingerprinted += [str(write.seq), write.fingerprint]
        fields = [text for pair in merged.items() for text in pair]
        if kept != deadline:  # every key that exists (PEXPIREAT leaves a missing one missing)
            fields += ["expires_at", str(kept)]
            expired: Sequence[str] = self.keys
        else:  # a new conversation's keys (turn.lua's WRITTEN), if it has a deadline
            expired = (meta, transcript, fingerprints) if first.first else ()
        return (
            ("RPUSH", transcript, *pushed),
            ("HSET", meta, *fields),
            ("HSET", fingerprints, *fingerprinted),
            *(("PEXPIREAT", key, str(kept)) for key in expired if kept > 0),
        )

    def reply(self) -> Any:
        """What the script would have answered: each turn's reply."""
        return [["appended", write.seq, write.rev + 1, 0] for write in self.writes]


def reply_of(raw: Sequence[Any]) -> AppendReply:
    """Read the script's reply."""
    status, last_seq = AppendStatus(as_text(raw[0])), int(raw[1])
    match status:
        case AppendStatus.APPENDED:
            return AppendReply(status, last_seq, rev=int(raw[2]), next_held=bool(int(raw[3])))
        case AppendStatus.DUPLICATE:
            return AppendReply(status, last_seq, next_held=bool(int(raw[3])), job=bool(int(raw[2])))
        case AppendStatus.CONFLICTING_DUPLICATE | AppendStatus.CONFLICTING_HELD:
            return AppendReply(status, last_seq, kept=as_text(raw[2]))
        case AppendStatus.STALE:
            flat = raw[2]
            stored = {as_text(k): as_text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
            return AppendReply(status, last_seq, meta=stored)
    return AppendReply(status, last_seq)
