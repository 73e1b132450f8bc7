"""A turn's one write (conversation/apply.py): the per-turn script's appends, duplicates, holds,
conflicts, runs and deadlines, against real Redis."""

from __future__ import annotations

import json
import time
from typing import Any
from unittest.mock import ANY

import pytest
import redis
import redis.asyncio
import redis.exceptions

from compaction_worker.contracts.events import ChatMessage, Trigger
from compaction_worker.contracts.history import Entry
from compaction_worker.conversation.apply import (
    AppendReply,
    AppendStatus,
    NewMessage,
    TurnWrite,
    encode_records,
)
from compaction_worker.conversation.meta import JOB_PRIORITY, JobRequest, recorded
from compaction_worker.settings import DEFAULT_INDEX_SHARDS
from compaction_worker.state.gaps import GapIndex, HeldTurn, held_value
from compaction_worker.state.lock import Locks
from compaction_worker.state.scripts import Pipeline, as_text
from compaction_worker.state.store import Store
from tests.conftest import cluster_tests
from tests.state.helpers import FP_A, FP_B, append, append_turn, hold, msg, write_run, write_turn

pytestmark = pytest.mark.integration


class TestAppend:
    async def test_appends_in_order_and_counts_tokens(self, store: Store) -> None:
        """Appends assign ordinals and keep the running token total without re-reading."""
        assert (
            await append(store, "c", 1, msg("a", tokens=7), msg("b", "assistant", tokens=5))
            == AppendStatus.APPENDED
        )
        assert await append(store, "c", 2, msg("c", tokens=3)) == AppendStatus.APPENDED
        meta = await store.meta("c")
        assert (meta.last_seq, meta.msg_count, meta.history_tokens) == (2, 3, 15)
        snapshot = await store.snapshot("c")
        assert [e.n for e in snapshot.history.entries] == [1, 2, 3]
        assert [e.seq for e in snapshot.history.entries] == [1, 1, 2]
        assert [r["m"]["content"] for r in await store.transcript("c")] == ["a", "b", "c"]

    async def test_originals_by_ordinal(self, store: Store) -> None:
        """The transcript's messages by ordinal, in one round trip; unknown ordinals are absent."""
        await append(store, "c", 1, msg("a"), msg("b", "assistant"))
        await append(store, "c", 2, msg("c"))
        found = await store.originals("c", [3, 1, 9])
        assert found == {1: {"role": "user", "content": "a"}, 3: {"role": "user", "content": "c"}}
        assert await store.originals("c", []) == {}

    async def test_duplicate_changes_nothing(self, store: Store) -> None:
        """A turn at or below the last seq is a no-op (docs/design.md, invariant 2)."""
        await append(store, "c", 1, msg("a"))
        before = await store.redis.lrange(store.keys("c").transcript, 0, -1)
        assert await append(store, "c", 1, msg("a")) == AppendStatus.DUPLICATE
        assert await store.redis.lrange(store.keys("c").transcript, 0, -1) == before
        assert (await store.meta("c")).history_tokens == 10

    async def test_a_gap_is_held_only_with_its_held_form(self, store: Store) -> None:
        """A turn that skips a seq is never appended: held when its held form came with it, else asked for."""
        await append(store, "c", 1, msg("a"))
        assert await append(store, "c", 3, msg("c")) == AppendStatus.NEED_HELD
        assert await store.redis.hlen(store.keys("c").pending) == 0
        held = held_value(b'{"turn": 3}', 1000, FP_A)
        reply = await write_turn(store, "c", _write(3, msg("c"), fingerprint=FP_A, held=held))
        assert (reply.status, reply.last_seq) == (AppendStatus.HELD, 1)
        assert await store.redis.hget(store.keys("c").pending, "3") == held
        # A redelivery keeps the first hold; another turn with that seq is refused.
        again = held_value(b'{"turn": 3}', 2000, FP_A)
        assert (
            await write_turn(store, "c", _write(3, fingerprint=FP_A, held=again))
        ).status is AppendStatus.HELD
        other = await write_turn(store, "c", _write(3, fingerprint=FP_B, held=again))
        assert (other.status, other.kept) == (AppendStatus.CONFLICTING_HELD, FP_A)
        assert await store.redis.hget(store.keys("c").pending, "3") == held
        assert (await store.meta("c")).last_seq == 1

    async def test_a_stale_revision_writes_nothing_and_gets_the_stored_meta(self, store: Store) -> None:
        """The caller's fields were computed from another revision: refused, with the meta to compute again from."""
        await append(store, "c", 1, msg("a"))
        keys = store.keys("c")
        before = [await store.redis.dump(k) for k in keys.all()]
        reply = await write_turn(store, "c", _write(2, msg("b"), rev=0, fields={"last_seq": "2"}))
        assert reply.status is AppendStatus.STALE
        assert reply.meta is not None
        assert reply.meta == await store.meta("c")
        assert [await store.redis.dump(k) for k in keys.all()] == before
        # Every writer bumps the revision: a compaction's commit, a no-op's mark.
        rev = (await store.meta("c")).rev
        await store.set_meta("c", noop_tokens=5)
        assert (await store.meta("c")).rev == rev + 1

    async def test_reply_carries_what_the_caller_acts_on(self, store: Store) -> None:
        """An append returns its seq, the new revision and whether the next turn is held; a duplicate too."""
        first = await append_turn(store, "c", 1, [msg("a", tokens=7)])
        assert (first.status, first.last_seq, first.next_held) == (AppendStatus.APPENDED, 1, False)
        assert first.rev == (await store.meta("c")).rev == 1
        await store.redis.hset(store.keys("c").pending, "3", b"0:{}")
        await store.redis.hset(store.keys("c").meta, "held", "1")  # as every writer of a held turn does
        second = await append_turn(store, "c", 2, [msg("b", tokens=1)])
        assert (second.next_held, second.rev) == (True, 2)
        assert (await store.meta("c")).history_tokens == 8
        again = await append_turn(store, "c", 1, [msg("a", tokens=7)])
        assert again == AppendReply(AppendStatus.DUPLICATE, last_seq=2, next_held=True, job=False)

    async def test_a_turns_job_is_decided_on_the_meta_and_stored_with_the_append(self, store: Store) -> None:
        """Issue 34: a turn's job is decided in Python on the meta it is decided on (meta.recorded) and
        written with the append, as meta fields; the script decides nothing of it. A recorded request
        is the job; a weaker one, with a stronger job pending, writes nothing."""
        reactive = JobRequest(Trigger.REACTIVE, "prompt is too long")
        assert recorded(reactive, await store.meta("c"), 0.0)[1] is True
        await append_turn(store, "c", 1, [msg("a")], request=reactive)
        meta = await store.meta("c")
        assert (bool(meta.job_id), meta.job_priority) == (True, JOB_PRIORITY[Trigger.REACTIVE])
        assert recorded(JobRequest(Trigger.THRESHOLD), meta, 0.0) == ({}, False)
        assert recorded(JobRequest(Trigger.MANUAL), meta, 0.0) == ({}, False)
        await append_turn(store, "c", 2, [msg("b")], request=JobRequest(Trigger.THRESHOLD))
        assert (
            await store.redis.hget(store.keys("c").meta, "job_trigger") == b"reactive"
        )  # the stronger stays

    async def test_the_held_turns_are_read_only_while_the_meta_says_some_may_be(self, store: Store) -> None:
        """Issue 35: a plain append reads the meta alone (four calls in all: the transcript is the only
        list it pushes to); a held turn sets the
        meta's ``held`` flag with it; the append that fills the gap finds none left and removes it."""
        if cluster_tests():
            pytest.skip("INFO commandstats is per node on a cluster")

        async def calls_of(seq: int, *messages: NewMessage) -> dict[str, int]:
            await store.redis.config_resetstat()
            assert await append(store, "c", seq, *messages) == AppendStatus.APPENDED
            stats = await store.redis.info("commandstats")
            names = ("hmget", "rpush", "hset", "hdel", "hlen", "hget", "hexists")
            return {n: stats[f"cmdstat_{n}"]["calls"] for n in names if f"cmdstat_{n}" in stats}

        await append(store, "c", 1, msg("a"))
        assert await calls_of(2, msg("b")) == {"hmget": 1, "rpush": 1, "hset": 2}
        held = held_value(b'{"turn": 4}', 1000, FP_A)
        assert (
            await write_turn(store, "c", _write(4, fingerprint=FP_A, held=held))
        ).status is AppendStatus.HELD
        assert await store.redis.hget(store.keys("c").meta, "held") == b"1"
        # The append before the held turn reads it (and says it is next); the held one then fills
        # the gap, finds no other, and removes the flag.
        await store.redis.config_resetstat()
        reply = await append_turn(store, "c", 3, [msg("c")])
        assert (reply.status, reply.next_held) == (AppendStatus.APPENDED, True)
        assert await append(store, "c", 4, msg("d"), fingerprint=FP_A) == AppendStatus.APPENDED
        assert await store.redis.hlen(store.keys("c").pending) == 0
        assert await store.redis.hget(store.keys("c").meta, "held") is None
        assert await calls_of(5, msg("e")) == {"hmget": 1, "rpush": 1, "hset": 2}

    async def test_a_held_flag_left_by_a_sweep_is_removed_by_the_next_append(self, store: Store) -> None:
        """A sweep that dead-letters the held turns leaves the flag (it touches only the held turns):
        the next append finds none held and removes it."""
        gaps = GapIndex(store, timeout_seconds=60, locks=Locks(store.redis, 60), shards=DEFAULT_INDEX_SHARDS)
        await append(store, "c", 1, msg("a"))
        await hold(gaps, "c", 3, b'{"held": 3}', fingerprint=FP_A)
        assert await store.redis.hget(store.keys("c").meta, "held") == b"1"
        await gaps.drop("c", 3)
        assert await append(store, "c", 2, msg("b")) == AppendStatus.APPENDED
        assert await store.redis.hget(store.keys("c").meta, "held") is None

    async def test_a_turn_writes_only_what_it_changes(self, store: Store) -> None:
        """Creation-time fields are written by the first append only; later appends leave them."""
        await append(store, "c", 1, msg("a"))
        created = await store.redis.hget(store.keys("c").meta, "created_at")
        assert created is not None
        await store.redis.hset(store.keys("c").meta, "context_status", "summarized")
        await append(store, "c", 2, msg("b"))
        assert await store.redis.hget(store.keys("c").meta, "created_at") == created
        assert await store.redis.hget(store.keys("c").meta, "context_status") == b"summarized"

    def test_messages_are_encoded_once_as_the_readers_read_them(self) -> None:
        """The script's records are the transcript's JSON records, and each reads as its entry:
        the entry ``Entry.to_json`` would give, read back."""
        messages = [msg('é \n "q"', tokens=3), NewMessage({"role": "tool", "content": [1, None]}, 2)]
        records = encode_records(4, 7, messages, 1764000000.125)
        for n, (new, record) in enumerate(zip(messages, records, strict=True), start=7):
            assert json.loads(record) == {
                "n": n,
                "seq": 4,
                "m": new.message,
                "at": 1764000000.125,
                "t": new.tokens,
            }
            entry = Entry(n=n, seq=4, message=new.message, tokens=new.tokens)
            assert Entry.from_json(record) == entry == Entry.from_json(entry.to_json())

    async def test_an_appended_entry_is_its_transcript_record(self, store: Store) -> None:
        """One text a message, stored once: in the transcript, which the snapshot reads as the
        history's verbatim tail; the entries list is not written."""
        await append(store, "c", 1, msg("a", tokens=7), msg("b", "assistant", tokens=5))
        keys = store.keys("c")
        assert await store.redis.exists(keys.entries) == 0
        assert await store.redis.llen(keys.transcript) == 2
        entries = (await store.snapshot("c")).history.entries
        assert [(e.n, e.seq, e.message["content"], e.tokens, e.edit) for e in entries] == [
            (1, 1, "a", 7, None),
            (2, 1, "b", 5, None),
        ]

    def test_a_message_text_given_is_stored_as_is(self) -> None:
        """The turn path passes each message's ``ChatMessage.to_json``: the records carry that text,
        which reads back as the message's data."""
        chat = ChatMessage.model_validate({"role": "user", "content": "é 日 \u2028", "x": [1.5e-7, 10**30]})
        new = NewMessage(chat.to_dict(), 5, chat.to_json())

        (record,) = encode_records(2, 1, [new], 1764000000.125)

        assert chat.to_json() in record
        assert json.loads(record)["m"] == Entry.from_json(record).message == chat.to_dict()

    async def test_large_numbers_are_stored_exactly(self, store: Store) -> None:
        """Numbers the script stores travel as text: a seq past 14 digits is not rounded."""
        await store.set_meta("c", last_seq=10**15)
        assert await append(store, "c", 10**15 + 1, msg("a"), fingerprint=FP_A) is AppendStatus.APPENDED
        assert (await store.meta("c")).last_seq == 10**15 + 1
        assert await store.fingerprint("c", 10**15 + 1) == FP_A

    async def test_thousands_of_messages_in_one_turn(self, store: Store) -> None:
        """Lists longer than Lua's unpack limit are pushed in batches."""
        many = [msg(f"m{i}", tokens=1) for i in range(3000)]
        assert await append(store, "c", 1, *many) == AppendStatus.APPENDED
        assert await store.redis.llen(store.keys("c").transcript) == 3000
        assert len((await store.snapshot("c")).history.entries) == 3000
        assert (await store.meta("c")).history_tokens == 3000

    async def test_retention_gives_every_key_one_deadline(self, store: Store) -> None:
        """The keys of a conversation expire together, at the deadline its meta keeps."""
        await append(store, "c", 1, msg("a"), fingerprint=FP_A)
        keys = store.keys("c")
        deadline = int(await store.redis.hget(keys.meta, "expires_at") or 0)
        for key in (keys.meta, keys.transcript, keys.fingerprints):
            assert await store.redis.pexpiretime(key) == deadline, key

    async def test_a_first_append_gives_its_deadline_to_what_exists_before_it_too(self, store: Store) -> None:
        """A new conversation's keys get its first deadline: those the append writes, and a key
        made before it with none (a fence from a lock taken first). The script does not expire
        the keys that do not exist one by one (one EXISTS asks for them all)."""
        keys = store.keys("c")
        await store.redis.incr(keys.fence)  # a lock taken before any turn: its fence has no deadline
        await append(store, "c", 1, msg("a"), fingerprint=FP_A)
        deadline = int(await store.redis.hget(keys.meta, "expires_at") or 0)
        made = (keys.meta, keys.transcript, keys.fingerprints, keys.fence)
        for key in made:
            assert await store.redis.pexpiretime(key) == deadline, key
        assert await store.redis.exists(*(k for k in keys.lasting() if k not in made)) == 0
        if cluster_tests():
            return  # INFO commandstats is per node
        await store.redis.config_resetstat()
        assert await append(store, "d", 1, msg("a"), fingerprint=FP_A) == AppendStatus.APPENDED
        stats = await store.redis.info("commandstats")
        assert (stats["cmdstat_pexpireat"]["calls"], stats["cmdstat_exists"]["calls"]) == (3, 1)

    async def test_a_turn_moves_the_deadline_only_when_half_the_retention_is_gone(self, store: Store) -> None:
        """Most turns leave expiry alone; the one that finds less than half left moves every key's, the archive's too."""
        await append(store, "c", 1, msg("a"))
        keys = store.keys("c")
        first = int(await store.redis.hget(keys.meta, "expires_at") or 0)
        await append(store, "c", 2, msg("b"))
        assert int(await store.redis.hget(keys.meta, "expires_at") or 0) == first
        assert await store.redis.pexpiretime(keys.transcript) == first
        # Less than half left (3600 s retention): the next turn moves the deadline for every key.
        soon = int(time.time() * 1000) + 1_000_000
        await store.redis.hset(keys.meta, "expires_at", soon)
        await store.redis.hset(keys.artifacts, "path:/src/a.py", "1")
        for key in keys.lasting():
            if await store.redis.exists(key):
                await store.redis.pexpireat(key, soon)
        await append(store, "c", 3, msg("c"))
        moved = int(await store.redis.hget(keys.meta, "expires_at") or 0)
        assert moved > soon + 2_000_000
        for key in keys.lasting():
            if await store.redis.exists(key):
                assert await store.redis.pexpiretime(key) == moved, key


JOB_OWN = {("meta", b"job_id")}


class TestScript:
    """The script's writes: deadlines and replies for a first turn, plain appends, a job, a run."""

    @staticmethod
    async def _stored(store: Store, cid: str) -> dict[str, Any]:
        """Every key of the conversation, by its name: its value and its deadline."""
        keys = store.keys(cid)
        dump: dict[str, Any] = {}
        for key in keys.lasting():
            kind = as_text(await store.redis.type(key))
            name = key.rsplit(":", 1)[1]
            if kind == "hash":
                stored = await store.redis.hgetall(key)
                # The job's id is its own, made for each.
                dump[name] = {k: v for k, v in stored.items() if (name, k) not in JOB_OWN}
            elif kind == "list":
                dump[name] = await store.redis.lrange(key, 0, -1)
            elif kind != "none":
                dump[name] = await store.redis.get(key)
            dump[f"{name} expires"] = await store.redis.pexpiretime(key)
        return dump

    @staticmethod
    async def _turns(store: Store, cid: str, job: JobRequest, at: float, before: str) -> list[object]:
        """A conversation's first turn, two plain appends, one asking for a job, then, with less than
        half the retention left, a run of three that moves the deadline; all at ``at``.

        Before the first turn (``before``): nothing; a deadline on the meta, as a seq handed out
        gives it (the keys the append creates get it); or a lock's fence, taken with no deadline
        to give it (the first append gives it one)."""
        keys = store.keys(cid)
        if before == "deadline":
            deadline = int(at * 1000) + 3_600_000
            await store.redis.hset(keys.meta, "expires_at", deadline)
            await store.redis.pexpireat(keys.meta, deadline)
        elif before == "fence":
            await store.redis.incr(keys.fence)
        fields = {"last_seq": "1", "msg_count": "1", "history_tokens": "10", "created_at": repr(at)}
        first = TurnWrite(1, [msg("a")], 1, fields, rev=0, now=at, fingerprint=FP_A, first=True)
        replies: list[object] = [await write_turn(store, cid, first)]
        replies.append(await TestScript._stored(store, cid))  # the new keys' deadline

        def turn(seq: int, job: JobRequest | None = None) -> TurnWrite:
            counts = {"last_seq": str(seq), "msg_count": str(2 * seq - 1), "history_tokens": str(20 * seq)}
            counts |= job.fields(at) if job is not None else {}
            two = [msg(f"u{seq}"), msg(f"a{seq}", "assistant")]
            return TurnWrite(seq, two, 2 * seq - 2, counts, rev=seq - 1, now=at, fingerprint=f"{seq:032d}")

        for seq in (2, 3):
            replies.append(await write_turn(store, cid, turn(seq)))
        replies.append(await write_turn(store, cid, turn(4, job)))
        soon = int(at * 1000) + 1_000_000  # the retention is an hour: less than half is left
        await store.redis.hset(store.keys(cid).meta, "expires_at", soon)
        replies.append(await write_run(store, cid, [turn(seq) for seq in (5, 6, 7)]))
        return replies

    @pytest.mark.parametrize("before", ["nothing", "deadline", "fence"])
    async def test_it_stores_the_turns_with_one_deadline(self, store: Store, before: str) -> None:
        """The turns' replies, and every key of the conversation with one deadline: a new
        conversation's keys get it, and a deadline moved with less than half the retention left
        goes to every key."""
        job, at = JobRequest(Trigger.MANUAL), int(time.time()) + 0.25
        replies = await self._turns(store, "s", job, at, before)
        assert replies[-1] == [AppendReply(AppendStatus.APPENDED, seq, rev=seq) for seq in (5, 6, 7)]
        stored = await self._stored(store, "s")
        assert stored["meta expires"] == stored["transcript expires"] > int(time.time() * 1000) + 3_000_000
        first = replies[1]
        assert isinstance(first, dict)
        assert first["meta expires"] == first["fingerprints expires"] > 0
        assert first["fence expires"] == (first["meta expires"] if before == "fence" else -2)
        assert stored["meta"][b"job_trigger"] == b"manual"

    async def test_a_connection_lost_after_the_script_was_sent_stores_the_turn_once(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The script reached Redis, its reply did not: the send is tried again on a new connection
        (the client's retry policy), and the script finds the turn stored: a duplicate."""
        if cluster_tests():
            pytest.skip("a cluster client sends each call itself, not through the pipeline")
        assert await append(store, "c", 1, msg("a")) == AppendStatus.APPENDED
        exchange = Pipeline._exchange
        lost: list[Any] = []

        async def losing(pipeline: Pipeline, connection: Any, commands: Any) -> list[Any]:
            replies = await exchange(pipeline, connection, commands)
            if commands[0][0] == "EVALSHA" and not lost:
                lost.append(commands)
                raise redis.exceptions.ConnectionError("the reply was lost")
            return replies

        monkeypatch.setattr(Pipeline, "_exchange", losing)
        reply = await write_turn(store, "c", _write(2, msg("b"), fields={"last_seq": "2"}))
        assert lost
        assert (reply.status, reply.last_seq) == (AppendStatus.DUPLICATE, 2)
        assert [r["m"]["content"] for r in await store.transcript("c")] == ["a", "b"]
        assert await store.redis.hget(store.keys("c").meta, "rev") == b"2"


def _write(
    seq: int,
    *messages: NewMessage,
    rev: int = 1,
    fields: dict[str, str] | None = None,
    fingerprint: str = "0" * 32,
    held: bytes | None = None,
) -> TurnWrite:
    """A write as the turn handler would send it (its fields are the test's)."""
    return TurnWrite(
        seq=seq,
        messages=messages,
        first_n=1,
        fields=fields or {},
        rev=rev,
        now=time.time(),
        fingerprint=fingerprint,
        held=held,
    )


class TestFingerprints:
    async def test_same_fingerprint_is_a_duplicate_another_is_a_conflict(self, store: Store) -> None:
        """A stored seq with the same fingerprint is a duplicate; with another, a conflicting duplicate; nothing moves."""
        assert await append(store, "c", 1, msg("a"), fingerprint=FP_A) == AppendStatus.APPENDED
        assert await store.fingerprint("c", 1) == FP_A
        keys = store.keys("c")
        before = [await store.redis.dump(k) for k in keys.all()]
        assert await append(store, "c", 1, msg("a"), fingerprint=FP_A) == AppendStatus.DUPLICATE
        assert await append(store, "c", 1, msg("b"), fingerprint=FP_B) == AppendStatus.CONFLICTING_DUPLICATE
        assert [await store.redis.dump(k) for k in keys.all()] == before
        assert await store.fingerprint("c", 1) == FP_A
        assert await store.fingerprint("c", 2) is None

    async def test_a_different_turn_for_a_held_seq_is_refused_and_the_held_one_kept(
        self, store: Store
    ) -> None:
        """The turn held behind a gap came first: another turn with its seq is refused, the held one applies."""
        gaps = GapIndex(store, 300, locks=Locks(store.redis, 60), shards=DEFAULT_INDEX_SHARDS)
        await append(store, "c", 1, msg("a"), fingerprint=FP_B)
        assert await hold(gaps, "c", 2, b'{"held": 1}', fingerprint=FP_A)
        assert await append(store, "c", 2, msg("other"), fingerprint=FP_B) == AppendStatus.CONFLICTING_HELD
        assert (await store.meta("c")).last_seq == 1
        assert await gaps.held_turn("c", 2) == HeldTurn(2, ANY, b'{"held": 1}', fingerprint=FP_A)
        assert await append(store, "c", 2, msg("held"), fingerprint=FP_A) == AppendStatus.APPENDED
        assert await gaps.held_turns("c") == []
        assert await store.fingerprint("c", 2) == FP_A


class TestOneScript:
    """A single turn is a run of one: the script answers a run's first turn as it answers it alone."""

    async def test_a_run_whose_first_turn_is_not_appended_gets_its_verdict_and_writes_nothing(
        self, store: Store
    ) -> None:
        assert await append(store, "c", 1, msg("a"), fingerprint=FP_A) == AppendStatus.APPENDED
        keys = store.keys("c")
        before = [await store.redis.dump(k) for k in keys.all()]
        cases = [
            (_write(1, msg("a"), rev=0, fingerprint=FP_A), AppendStatus.DUPLICATE),
            (_write(1, msg("other"), rev=0, fingerprint=FP_B), AppendStatus.CONFLICTING_DUPLICATE),
            (_write(2, msg("b"), rev=7), AppendStatus.STALE),  # a revision another writer moved on from
        ]
        for first, status in cases:
            alone = await write_turn(store, "c", first)
            assert alone.status is status
            following = _write(first.seq + 1, msg("next"), rev=first.rev + 1)
            assert await write_run(store, "c", [first, following]) == [alone]
        assert [await store.redis.dump(k) for k in keys.all()] == before

    async def test_a_run_of_one_holds_a_turn_ahead_of_a_gap(self, store: Store) -> None:
        assert await append(store, "c", 1, msg("a")) == AppendStatus.APPENDED
        ahead = _write(3, msg("c"), held=b'{"held": 3}')
        assert [(r.status, r.last_seq) for r in await write_run(store, "c", [ahead])] == [
            (AppendStatus.HELD, 1)
        ]
        assert await store.redis.hget(store.keys("c").pending, "3") == b'{"held": 3}'
