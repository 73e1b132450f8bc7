"""The outbox: a committed compaction's completion event survives the death of its worker."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio

from compaction_worker.contracts.events import CompactionCompleted, Outcome
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import DEFAULT_INDEX_SHARDS, Settings
from compaction_worker.state.index import now_ms
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.outbox import Outbox, pack, unpack
from compaction_worker.state.store import Store
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, compact_now, conversation, make_parts

pytestmark = pytest.mark.integration


class DiesAfterCommit(Exception):
    """What a worker killed between its commit and its publish looks like to the test."""


class Dying:
    """A publisher that fails every completion event: the worker 'dies' right after committing."""

    def __init__(self, inner: Published) -> None:
        self.inner = inner

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        if topic == "compaction.completed":
            raise DiesAfterCommit
        await self.inner(topic, payload, key)


def test_pack_round_trips() -> None:
    """The stored value keeps the topic and the exact event bytes."""
    payload = json.dumps({"a": "x\ny"}).encode()
    assert unpack(pack("compaction.completed", payload)) == ("compaction.completed", payload)


async def test_a_commit_publishes_its_event_and_leaves_nothing_behind(
    parts: Parts, published: Published, redis_client: redis.asyncio.Redis
) -> None:
    """The live path: the event is written with the commit, published, then removed with its index entry."""
    for turn in conversation(24):
        await parts.turns.handle(turn, b"c")
    done = await compact_now(parts.jobs, parts.compactor)
    assert done.outcome is Outcome.COMPACTED
    (event,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
    assert event == done
    assert await redis_client.hlen(parts.store.keys("c").outbox) == 0
    assert await redis_client.zcard(parts.compactor.outbox.index.key_of("c")) == 0
    (record,) = await parts.store.compactions("c")
    assert record["compaction_id"] == str(done.compaction_id)


async def test_an_event_left_by_a_dead_worker_is_relayed_once(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published
) -> None:
    """Killed after the commit: the state is committed, the event is in the outbox, a sweeper publishes it once."""
    settings.worker.lock_ttl_seconds = 1  # the grace before a sweeper may step in
    dying = make_parts(redis_client, settings, Dying(published))
    store = dying.store
    for turn in conversation(24):
        await dying.turns.handle(turn, b"c")
    with pytest.raises(DiesAfterCommit):
        await run_job(dying.jobs, dying.compactor, "c")
    assert (await store.meta("c")).version == 1  # committed
    assert published.on("compaction.completed") == []
    assert await redis_client.hlen(store.keys("c").outbox) == 1

    sweepers = [
        Outbox(store, published, Locks(redis_client, 1), 1, shards=DEFAULT_INDEX_SHARDS) for _ in range(3)
    ]
    assert (
        sum([(await s.relay()).done for s in sweepers]) == 0
    )  # within the grace: the worker may still deliver
    await asyncio.sleep(1.1)
    counts = await asyncio.gather(*(s.relay() for s in sweepers))
    assert sorted(c.done for c in counts) == [0, 0, 1]  # one relay took the lock; the others skipped it
    (event,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
    assert (event.outcome, event.version) == (Outcome.COMPACTED, 1)
    assert await redis_client.hlen(store.keys("c").outbox) == 0
    assert await redis_client.zcard(sweepers[0].index.key_of("c")) == 0


async def test_an_event_left_waiting_is_published_before_the_next_commits(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published
) -> None:
    """A commit whose publish failed (the broker was down) is sent first by the next commit: versions in order."""
    dying = make_parts(redis_client, settings, Dying(published))
    for turn in conversation(24):
        await dying.turns.handle(turn, b"c")
    with pytest.raises(DiesAfterCommit):
        await run_job(dying.jobs, dying.compactor, "c")
    live = make_parts(redis_client, settings, published)
    await live.turns.handle(turn_bytes("c", 25, [], compaction={"mode": "force"}), b"c")

    done = await compact_now(live.jobs, live.compactor)

    assert done.outcome is Outcome.COMPACTED
    events = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
    assert [e.version for e in events] == [1, 2]
    assert await redis_client.hlen(live.store.keys("c").outbox) == 0
    assert await redis_client.zcard(live.compactor.outbox.index.key_of("c")) == 0


async def test_an_event_written_while_the_entry_goes_keeps_an_entry(
    redis_client: redis.asyncio.Redis, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay that finds an empty outbox removes the entry, then reads the hash again: an event
    written in between (a commit's, whose worker then died) is not left without an entry."""
    store = Store(redis_client, "t", None)
    outbox = Outbox(store, published, Locks(redis_client, 1), 1, shards=DEFAULT_INDEX_SHARDS)
    await redis_client.zadd(outbox.index.key_of("c"), {"c": 0})  # due, empty outbox
    remove = outbox.index.remove

    async def remove_then_commit(conversation_id: str) -> None:
        await remove(conversation_id)
        await redis_client.hset(store.keys("c").outbox, "000000000001-x", pack("compaction.completed", b"{}"))

    monkeypatch.setattr(outbox.index, "remove", remove_then_commit)
    assert (await outbox.relay()).done == 0
    assert await redis_client.zscore(outbox.index.key_of("c"), "c") is not None


async def test_a_relay_skips_a_conversation_whose_lock_is_held(
    redis_client: redis.asyncio.Redis, published: Published
) -> None:
    """A run holding the conversation's lock delivers its own events: a relay leaves them, and looks
    again when that lock would expire (not sooner)."""
    store = Store(redis_client, "t", None)
    locks = Locks(redis_client, 30)
    outbox = Outbox(store, published, locks, 1, shards=DEFAULT_INDEX_SHARDS)
    await redis_client.hset(store.keys("c").outbox, "000000000001-x", pack("compaction.completed", b"{}"))
    await redis_client.zadd(outbox.index.key_of("c"), {"c": 0})
    assert isinstance(await locks.acquire("c", store.keys("c")), Lease)
    assert (await outbox.relay()).done == 0
    assert published.events == []
    score = await outbox.index.score("c")
    assert score is not None
    assert score > now_ms() + 29_000
