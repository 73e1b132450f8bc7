"""Turns held behind a gap, against real Redis: expiry to the DLQ, the index, concurrent sweeps."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from typing import Any, cast

import pytest
import redis.asyncio

from compaction_worker.contracts.events import BadEventError, DeadLetter, TurnEvent
from compaction_worker.conversation.keys import bucket_keys, gaps_index_key, shard_of
from compaction_worker.runtime.turns import TurnHandler, TurnStatus
from compaction_worker.settings import DEFAULT_INDEX_SHARDS, Settings
from compaction_worker.state.gaps import GapIndex, HeldTurn, held_value, parse_held
from compaction_worker.state.lock import Lease
from compaction_worker.state.refusals import Rejection
from compaction_worker.testing import turn_bytes
from tests import orchestration
from tests.orchestration import Parts, Published, assistant, user
from tests.state.helpers import hold

OTHER = "f" * 32
"""A fingerprint of bytes no test turn has."""

pytestmark = pytest.mark.integration

DLQ = "conversation.turn.dlq"
TIMEOUT = 300.0  # the default gap_timeout_seconds, which the test settings keep


def letters(published: Published) -> list[DeadLetter]:
    return [DeadLetter.model_validate(r) for r in published.on(DLQ)]


async def held_ms(gaps: GapIndex, cid: str, seq: int) -> int:
    """When a turn was held, in epoch ms (from the stored prefix)."""
    turn = await gaps.held_turn(cid, seq)
    assert turn is not None
    return turn.held_ms


async def held_seqs(gaps: GapIndex, cid: str) -> list[int]:
    return [h.turn_seq for h in await gaps.held_turns(cid)]


async def index_score(redis_client: redis.asyncio.Redis, cid: str) -> float | None:
    return await redis_client.zscore(gap_key(cid), cid)


def gap_key(cid: str) -> str:
    """The held-turn index bucket of a conversation (prefix ``t``, default shards)."""
    return bucket_keys(gaps_index_key("t"), DEFAULT_INDEX_SHARDS)[shard_of(cid, DEFAULT_INDEX_SHARDS)]


async def stored_state(redis_client: redis.asyncio.Redis, cid: str) -> dict[bytes, bytes | None]:
    """Every key of a conversation except the held turns, the fence and the rejections, serialized:
    any change shows. (A sweep holds the conversation's lock, and the fence counts every acquisition;
    a turn it dead-letters is recorded for its runtime: state/refusals.py.)"""
    skip = {f"t:{{{cid}}}:{name}".encode() for name in ("pending", "fence", "refused")}
    keys = cast("list[bytes]", await redis_client.keys(f"t:{{{cid}}}:*"))  # the client does not decode
    return {k: await redis_client.dump(k) for k in sorted(keys) if k not in skip}


class TestExpiry:
    async def test_held_turn_expires_to_the_dlq_with_its_original_bytes(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """After the timeout a held turn is a sequence_gap letter with its bytes and a detail; it leaves the hash."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        third = turn_bytes("c", 3, [user("three")])
        assert (await parts.turns.handle(third, b"c")).status is TurnStatus.BUFFERED
        since_ms = await held_ms(parts.gaps, "c", 3)
        assert await index_score(redis_client, "c") == since_ms

        expired = await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + TIMEOUT + 1)

        assert [(e.conversation_id, e.turn_seq) for e in expired] == [("c", 3)]
        (letter,) = letters(published)
        assert (letter.reason.value, letter.conversation_id, letter.turn_seq) == ("sequence_gap", "c", 3)
        assert base64.b64decode(letter.original_b64) == third
        assert letter.original_size == len(third)
        assert base64.b64decode(letter.key_b64 or "") == b"c"
        assert re.fullmatch(r"turn 3 of c waited 30[01] s for turn 2", letter.detail), letter.detail
        assert [(t, k) for t, _, k in published.events] == [(DLQ, b"c")]
        assert await held_seqs(parts.gaps, "c") == []
        assert await index_score(redis_client, "c") is None

    async def test_an_expired_turn_stays_held_until_its_letter_is_sent(
        self, parts: Parts, redis_client: redis.asyncio.Redis
    ) -> None:
        """Issue 34: the sweep holds the conversation's lock while it sends; the turn is still held
        while its letter is sent, and forgotten once it is."""
        third = turn_bytes("c", 3, [user("three")])
        await hold(parts.gaps, "c", 3, third, now=1000.0)
        seen: list[tuple[int, list[int], bool]] = []

        async def dead_letter(raw: bytes, cid: str, turn_seq: int, error: BadEventError) -> None:
            locked = await redis_client.exists(parts.store.keys(cid).lock)
            seen.append((turn_seq, await held_seqs(parts.gaps, cid), bool(locked)))

        (turn,) = await parts.gaps.expire(dead_letter, now=1000.0 + TIMEOUT + 1)

        assert (turn.turn_seq, turn.error.reason.value, turn.raw) == (3, "sequence_gap", third)
        assert seen == [(3, [3], True)]
        assert await held_seqs(parts.gaps, "c") == []
        assert await index_score(redis_client, "c") is None
        assert not await redis_client.exists(parts.store.keys("c").lock)

    async def test_a_conversation_whose_lock_another_holds_is_looked_at_when_it_runs_out(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """A compaction (or another sweep) holds the lock: nothing is sent, and the index makes the
        conversation due again when that lock runs out, not at every sweep."""
        await hold(parts.gaps, "c", 3, turn_bytes("c", 3, [user("three")]), now=1000.0)
        lease = await parts.locks.acquire("c", parts.store.keys("c"))
        assert isinstance(lease, Lease)

        assert await parts.gaps.expire(parts.dead_letters.held, now=time.time() + TIMEOUT) == []

        assert letters(published) == []
        assert await held_seqs(parts.gaps, "c") == [3]
        due = (await index_score(redis_client, "c") or 0) + TIMEOUT * 1000
        assert time.time() * 1000 < due <= time.time() * 1000 + parts.locks.ttl_ms
        await parts.locks.release(lease, parts.store.keys("c"))
        (expired,) = await parts.gaps.expire(parts.dead_letters.held, now=due / 1000 + 1)
        assert expired.turn_seq == 3

    async def test_turn_not_yet_expired_stays_held(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """Only turns past the timeout expire; the index then points at the oldest turn still held."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        since_ms = await held_ms(parts.gaps, "c", 3)
        await hold(parts.gaps, "c", 4, turn_bytes("c", 4, [assistant("four")]), now=since_ms / 1000 + 200)

        assert await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + TIMEOUT - 1) == []
        assert published.events == []
        assert await held_seqs(parts.gaps, "c") == [3, 4]

        assert [
            e.turn_seq
            for e in await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + TIMEOUT + 1)
        ] == [3]
        assert await held_seqs(parts.gaps, "c") == [4]
        assert await index_score(redis_client, "c") == pytest.approx(since_ms + 200_000, abs=1)

        assert [
            e.turn_seq
            for e in await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + 200 + TIMEOUT + 1)
        ] == [4]
        assert [letter.turn_seq for letter in letters(published)] == [3, 4]
        assert await index_score(redis_client, "c") is None

    async def test_gap_filled_in_time_leaves_the_index_and_letters_nothing(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """The missing turn releases the held ones; the conversation leaves the index; a late sweep sends nothing."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        await parts.turns.handle(turn_bytes("c", 4, [assistant("four")]), b"c")
        assert await index_score(redis_client, "c") is not None

        assert (
            await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        ).status is TurnStatus.APPENDED

        assert [r["seq"] for r in await parts.store.transcript("c")] == [1, 2, 3, 4]
        assert await index_score(redis_client, "c") is None
        assert await parts.gaps.expire(parts.dead_letters.held, now=time.time() + 10 * TIMEOUT) == []
        assert published.events == []

    async def test_partly_filled_gap_keeps_the_rest_indexed(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """Filling the first of two gaps releases what it can; what waits on the second stays indexed."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        await parts.turns.handle(turn_bytes("c", 5, [user("five")]), b"c")
        since_ms = await held_ms(parts.gaps, "c", 5)

        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")

        assert (await parts.store.meta("c")).last_seq == 3
        assert await held_seqs(parts.gaps, "c") == [5]
        assert await index_score(redis_client, "c") == since_ms
        (expired,) = await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + TIMEOUT + 1)
        assert expired.detail.endswith("for turn 4")

    async def test_expiry_changes_no_stored_state_and_the_gap_still_waits(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """Expiry touches only the held turns; later turns are held (and expire) again; the missing turn still fits."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")], system_prompt="Be brief."), b"c")
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        await parts.turns.handle(turn_bytes("c", 4, [assistant("four")]), b"c")
        await parts.turns.handle(turn_bytes("c", 5, [user("five")]), b"c")
        before = await stored_state(redis_client, "c")
        meta, snapshot = await parts.store.meta("c"), await parts.store.snapshot("c")
        since_ms = await held_ms(parts.gaps, "c", 4)

        assert [
            e.turn_seq
            for e in await parts.gaps.expire(parts.dead_letters.held, now=since_ms / 1000 + TIMEOUT + 1)
        ] == [
            4,
            5,
        ]

        assert await stored_state(redis_client, "c") == before
        assert await parts.store.meta("c") == meta
        assert await parts.store.snapshot("c") == snapshot
        refused = await redis_client.hgetall(parts.store.keys("c").refused)
        assert {k: Rejection.from_json(v).reason for k, v in refused.items()} == {
            b"4": "sequence_gap",
            b"5": "sequence_gap",
        }
        assert (
            await parts.turns.handle(turn_bytes("c", 6, [assistant("six")]), b"c")
        ).status is TurnStatus.BUFFERED
        again = await parts.gaps.expire(parts.dead_letters.held, now=time.time() + TIMEOUT + 1)
        assert [(e.turn_seq, e.detail.endswith("for turn 3")) for e in again] == [(6, True)]
        assert (
            await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        ).status is TurnStatus.APPENDED
        assert [r["seq"] for r in await parts.store.transcript("c")] == [1, 2, 3]
        assert [letter.turn_seq for letter in letters(published)] == [4, 5, 6]


class SlowPublisher(Published):
    """Yields to the event loop while publishing, so that concurrent sweeps interleave."""

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        await asyncio.sleep(0.001)
        await super().__call__(topic, payload, key)


class FailingOnce(Published):
    """Raises on the first publish (the broker is away), then works."""

    failed = False

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionError("broker unavailable")
        await super().__call__(topic, payload, key)


class ReholdingPublisher(Published):
    """While the first letter is being published, the held turn is replaced by one with other bytes
    (written past the sweep's lock: its hold time and fingerprint tell the copies apart)."""

    def __init__(self, redis_client: redis.asyncio.Redis) -> None:
        super().__init__()
        self.redis = redis_client

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        if not self.events:
            await self.redis.hdel("t:{c}:pending", "3")
            await self.redis.hset("t:{c}:pending", "3", held_value(b'{"other": "bytes"}', 2_000_000, OTHER))
        await super().__call__(topic, payload, key)


class TestConcurrency:
    async def test_two_sweepers_dead_letter_each_turn_once(
        self, redis_client: redis.asyncio.Redis, redis_url: str, settings: Settings
    ) -> None:
        """Two workers (own connections) sweeping at once send each expired turn exactly once."""
        published = SlowPublisher()
        first = orchestration.make_parts(redis_client, settings, published)
        other_client = orchestration.connect(redis_url)
        try:
            second = orchestration.make_parts(other_client, settings, published)
            held = {(cid, seq) for cid in ("a", "b", "c") for seq in range(3, 13)}
            for cid, seq in sorted(held):
                await hold(
                    first.gaps, cid, seq, turn_bytes(cid, seq, [user(f"{cid}{seq}")]), now=1000.0 + seq
                )
            now = 1000.0 + 12 + TIMEOUT + 1

            results = await asyncio.gather(
                *(p.gaps.expire(p.dead_letters.held, now=now) for p in (first, second, first, second))
            )

            sent = [(letter.conversation_id, letter.turn_seq) for letter in letters(published)]
            assert sorted(sent) == sorted(held)  # each once: no duplicates, none missing
            assert sum(len(r) for r in results) == len(held)
            assert await redis_client.hlen("t:{a}:pending") == 0
            assert await first.gaps.held_count() == 0
        finally:
            await other_client.aclose()

    async def test_a_failed_publish_leaves_the_turn_for_the_next_sweep(
        self, redis_client: redis.asyncio.Redis, settings: Settings
    ) -> None:
        """A publish that fails keeps the turn held, and the lock is given back: the next sweep sends it once."""
        published = FailingOnce()
        parts = orchestration.make_parts(redis_client, settings, published)
        gaps, dead_letters = parts.gaps, parts.dead_letters
        await hold(gaps, "c", 3, turn_bytes("c", 3, [user("three")]), now=1000.0)
        now = 1000.0 + TIMEOUT + 1

        with pytest.raises(ConnectionError):
            await gaps.expire(dead_letters.held, now=now)
        assert await held_seqs(gaps, "c") == [3]
        assert not await redis_client.exists(parts.store.keys("c").lock)

        (expired,) = await gaps.expire(dead_letters.held, now=now + 1)
        assert expired.turn_seq == 3
        assert [letter.turn_seq for letter in letters(published)] == [3]
        assert await held_seqs(gaps, "c") == []

    async def test_a_sweep_deletes_only_the_copy_it_read(
        self, redis_client: redis.asyncio.Redis, settings: Settings
    ) -> None:
        """A copy held in place of the one a sweep published (other bytes) is not deleted by that sweep."""
        parts = orchestration.make_parts(redis_client, settings, ReholdingPublisher(redis_client))
        await hold(parts.gaps, "c", 3, turn_bytes("c", 3, [user("three")]), now=1000.0)

        assert [
            e.turn_seq for e in await parts.gaps.expire(parts.dead_letters.held, now=1000.0 + TIMEOUT + 1)
        ] == [3]

        assert await parts.gaps.held_turn("c", 3) == HeldTurn(3, 2_000_000, b'{"other": "bytes"}', OTHER)
        assert await index_score(redis_client, "c") == 2_000_000

    async def test_index_keeps_the_oldest_hold_time(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """A turn held earlier than the one that indexed its conversation (clocks differ) moves the score back."""
        await hold(parts.gaps, "c", 5, turn_bytes("c", 5, [user("five")]), now=2000.0)
        await hold(parts.gaps, "c", 4, turn_bytes("c", 4, [user("four")]), now=1000.0)
        assert await index_score(redis_client, "c") == 1_000_000
        assert [
            e.turn_seq for e in await parts.gaps.expire(parts.dead_letters.held, now=1000.0 + TIMEOUT + 1)
        ] == [4]

    async def test_a_held_copy_of_a_stored_turn_is_dropped_without_a_letter(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """A turn held by a worker that lost a race with its append is a duplicate: dropped, not dead-lettered."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        await hold(parts.gaps, "c", 2, turn_bytes("c", 2, [assistant("two")]), now=1000.0)

        assert await parts.gaps.expire(parts.dead_letters.held, now=1000.0 + TIMEOUT + 1) == []

        assert published.events == []
        assert await held_seqs(parts.gaps, "c") == []
        assert await index_score(redis_client, "c") is None

    async def test_a_held_copy_of_a_stored_seq_with_other_content_is_a_conflicting_duplicate(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """A held copy whose seq was stored with other content is a conflicting_duplicate letter, not a silent drop."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        same, other = (
            turn_bytes("c", 2, [assistant("two")]),
            turn_bytes("c", 2, [assistant("two, but other")]),
        )
        await hold(parts.gaps, "c", 2, same, now=1000.0, fingerprint=await parts.store.fingerprint("c", 2))
        assert await parts.gaps.expire(parts.dead_letters.held, now=1000.0 + TIMEOUT + 1) == []
        other_fp = TurnEvent.model_validate_json(other).fingerprint()
        await hold(parts.gaps, "c", 2, other, now=1000.0, fingerprint=other_fp)

        (sent,) = await parts.gaps.expire(parts.dead_letters.held, now=1000.0 + TIMEOUT + 1)

        (letter,) = letters(published)
        assert (letter.reason.value, letter.turn_seq, sent.turn_seq) == ("conflicting_duplicate", 2, 2)
        assert base64.b64decode(letter.original_b64) == other
        assert letter.detail == sent.detail
        assert other_fp in letter.detail
        assert await held_seqs(parts.gaps, "c") == []
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == ["one", "two"]

    async def test_index_entry_without_held_turns_is_dropped(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
    ) -> None:
        """An index entry left by a crash (or by retention) is dropped by the sweep, sending nothing."""
        await redis_client.zadd(gap_key("gone"), {"gone": 1})
        assert await parts.gaps.expire(parts.dead_letters.held) == []
        assert await redis_client.zcard(gap_key("gone")) == 0
        assert published.events == []

    async def test_a_turn_held_during_reindex_stays_indexed(
        self, parts: Parts, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reindexing finds nothing held, then a turn is held before it drops the entry: the entry survives."""
        gaps = parts.gaps
        await redis_client.zadd(gap_key("c"), {"c": 1})
        real_zrem = redis_client.zrem

        async def zrem_after_a_hold(*args: Any) -> Any:
            await hold(gaps, "c", 3, turn_bytes("c", 3, [user("three")]), now=5.0)
            return await real_zrem(*args)

        monkeypatch.setattr(redis_client, "zrem", zrem_after_a_hold)
        await gaps.reindex("c")
        assert await index_score(redis_client, "c") == 5000


class TestHeldTurns:
    async def test_a_redelivered_duplicate_releases_the_turn_held_behind_it(self, parts: Parts) -> None:
        """A crash between an append and its drain: the redelivery of the appended turn releases the next."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        second = turn_bytes("c", 2, [assistant("two")])
        await parts.turns.handle_held(second, "c", 2)  # applied, but not drained: the "crash"
        assert await held_seqs(parts.gaps, "c") == [3]

        assert (await parts.turns.handle(second, b"c")).status is TurnStatus.DUPLICATE

        assert [r["seq"] for r in await parts.store.transcript("c")] == [1, 2, 3]
        assert await held_seqs(parts.gaps, "c") == []

    async def test_held_turn_invalid_on_release_is_dead_lettered_once_and_dropped(
        self, parts: Parts, published: Published, settings: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """A held turn that the settings now reject goes to the DLQ at release and no longer blocks or expires."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")], model="mystery-model-x"), b"c")
        settings.budget.fallback_window = None  # unknown models are now refused

        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")

        assert [(letter.reason.value, letter.turn_seq) for letter in letters(published)] == [
            ("unknown_model", 3)
        ]
        assert await held_seqs(parts.gaps, "c") == []
        assert await index_score(redis_client, "c") is None
        assert await parts.gaps.expire(parts.dead_letters.held, now=time.time() + 10 * TIMEOUT) == []
        assert len(letters(published)) == 1

    def test_held_form_carries_the_fingerprint(self) -> None:
        """The fingerprint follows the hold time; a malformed one, or none, is refused."""
        body = b'  {"x": "ab:cd"}'
        fp_a, fp_b = "a" * 32, "0123456789abcdef" * 2
        assert parse_held(2, held_value(body, 5, fp_a)) == HeldTurn(2, 5, body, fp_a)
        assert parse_held(2, b"5:" + fp_b.encode() + b":" + body) == HeldTurn(2, 5, body, fp_b)
        assert HeldTurn(2, 5, body, fp_b).stamp == f"5:{fp_b}:"
        with pytest.raises(ValueError, match="fingerprint"):
            held_value(body, 5, "not-hex")
        with pytest.raises(ValueError, match="no fingerprint"):
            parse_held(2, b"5:" + body)
        with pytest.raises(ValueError, match="no hold time"):
            parse_held(2, body)

    def test_stored_form_keeps_the_bytes_exactly(self) -> None:
        """The prefix is split off exactly, whatever bytes follow (digits and colons included)."""
        body = b'{"x": "12:34"}\x00\xff'
        assert parse_held(7, held_value(body, 1234, OTHER)) == HeldTurn(7, 1234, body, OTHER)


class TestSetting:
    def test_default_and_validation(self) -> None:
        """Five minutes by default; must be positive and below the retention that would drop held turns."""
        assert Settings().worker.gap_timeout_seconds == 300
        assert Settings(worker={"gap_timeout_seconds": 0.5}).worker.gap_timeout_seconds == 0.5
        for bad in (0, -1):
            with pytest.raises(ValueError, match="gap_timeout_seconds"):
                Settings(worker={"gap_timeout_seconds": bad})
        with pytest.raises(ValueError, match=r"below redis\.retention_seconds"):
            Settings(worker={"gap_timeout_seconds": 600}, redis={"retention_seconds": 600})
        kept = Settings(worker={"gap_timeout_seconds": 600}, redis={"retention_seconds": None})
        assert kept.worker.gap_timeout_seconds == 600

    def test_environment_variable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """COMPACTION_WORKER__GAP_TIMEOUT_SECONDS sets it."""
        monkeypatch.setenv("COMPACTION_WORKER__GAP_TIMEOUT_SECONDS", "42")
        assert Settings().worker.gap_timeout_seconds == 42


async def test_turn_handler_uses_the_configured_timeout(redis_client: redis.asyncio.Redis) -> None:
    """The handler's gap index takes its timeout from worker.gap_timeout_seconds."""
    settings = orchestration.make_settings(worker={"gap_timeout_seconds": 7})
    turns = orchestration.make_parts(redis_client, settings, Published()).turns
    assert isinstance(turns, TurnHandler)
    assert turns.gaps.timeout_ms == 7000
