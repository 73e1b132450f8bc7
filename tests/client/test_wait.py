"""Waiting for compactions and drawing turn seqs, against the real broker, Redis and worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from compaction_worker.client import Client, SyncClient
from compaction_worker.contracts.history import public_message
from compaction_worker.errors import CompactionWorkerError, RewindError, WaitTimeoutError
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.testing import FakeLLMServer, turn_bytes, turn_event
from tests.orchestration import Parts, make_settings, user

pytestmark = pytest.mark.integration

WINDOW = 3000


@pytest.fixture
async def running(
    kafka_bootstrap: str, redis_url: str, make_topics: object, fake_llm: FakeLLMServer
) -> AsyncIterator[Client]:
    """A worker on topics of its own, and a client of it."""
    topics = await make_topics("turn", "started", "completed", "dlq")  # type: ignore[operator]
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer={"model": "openai/fake-summarizer", "api_base": fake_llm.url, "api_key": "fake-key-0123"},
    )
    await ensure_topics(settings)
    async with build_worker(settings).running(), Client.connect(settings) as client:
        yield client


async def test_wait_for_a_real_compaction(running: Client) -> None:
    """wait_for(version) returns once the worker committed it; then at once; later versions time out."""
    client = running
    for event in synthetic_turns("w", 12, context_window=WINDOW):
        await client.publish_turn(event)

    reached = await client.wait_for("w", 1, timeout=60)

    meta = await client.meta("w")
    assert reached >= 1
    assert meta.version >= reached
    assert (await client.compactions("w"))[0]["version"] == 1
    settled = await client.wait_for("w", timeout=60)  # and whatever it set off since
    assert await client.job("w") is None
    assert (await client.meta("w")).last_seq == 12
    assert settled == (await client.meta("w")).version

    # Already reached: no waiting, so no time to wait is needed either.
    assert await client.wait_for("w", 1, timeout=0) == settled

    start = time.monotonic()
    with pytest.raises(WaitTimeoutError, match="version 99") as raised:
        await client.wait_for("w", 99, timeout=1.0)
    assert time.monotonic() - start >= 1.0
    assert isinstance(raised.value, TimeoutError)
    assert isinstance(raised.value, CompactionWorkerError)


async def test_a_noop_compaction_ends_the_wait(running: Client) -> None:
    """A request the worker has not read yet counts as pending; a run that changes nothing ends the wait."""
    client = running
    seq = await client.next_turn_seq("n")
    await client.publish_turn(turn_event("n", seq, [user("hi")]))
    request = await client.request_compaction("n", await client.next_turn_seq("n"), "gpt-4o-mini")

    version = await client.wait_for("n", timeout=60)

    assert version == 0
    assert (await client.meta("n")).last_seq == request.turn_seq == 2
    assert await client.job("n") is None


async def test_a_run_still_holding_the_lock_is_waited_for(running: Client) -> None:
    """A run finishes its job before it lets the lock go (and may schedule the next one in
    between): wait_for returns only once the lock is free, so a rewind right after it is not refused."""
    client = running
    await client.publish_turn(turn_event("held", 1, [user("hello")]))
    await client.wait_for("held", timeout=30)
    keys = client.store.keys("held")
    locks = Locks(client.store.redis, 30.0)
    lease = await locks.acquire("held", keys)
    assert isinstance(lease, Lease)
    with pytest.raises(WaitTimeoutError):
        await client.wait_for("held", timeout=1.5)
    await locks.release(lease, keys)
    assert await client.wait_for("held", timeout=30) == 0


async def test_next_turn_seq_under_concurrent_callers(parts: Parts, settings: Settings) -> None:
    """50 gathered callers get 50 distinct, consecutive seqs, after the stored ones."""
    await parts.turns.handle(turn_bytes("c", 1, [user("hello")]), b"c")
    client = Client(settings, parts.store, None)
    seqs = await asyncio.gather(*(client.next_turn_seq("c") for _ in range(50)))
    assert sorted(seqs) == list(range(2, 52))


async def test_sync_client_round_trip(running: Client, redis_client: redis.asyncio.Redis) -> None:
    """Plain synchronous code (in a thread with no event loop) publishes, waits and reads."""
    settings = running.settings

    def runtime() -> tuple[list[str], int]:
        with SyncClient.connect(settings) as client:
            for text in ("first", "second"):
                seq = client.next_turn_seq("s")
                receipt = client.publish_turn(turn_event("s", seq, [user(text)]))
            client.wait_for("s", timeout=30)
            result = client.wait_for(receipt, timeout=30)  # the second turn's answer
            return [m["content"] for m in client.messages("s")], result.turn_seq

    assert await asyncio.to_thread(runtime) == (["first", "second"], 2)


async def test_rewind_from_the_client_undoes_every_compaction_back_to_the_transcript(running: Client) -> None:
    """Client.versions lists what each compaction replaced and whether it is in effect; Client.rewind
    undoes the latest one in effect, and once every one is undone the history is the transcript, verbatim."""
    client = running
    for event in synthetic_turns("r", 12, context_window=WINDOW):
        await client.publish_turn(event)
    await client.wait_for("r", 1, timeout=60)
    await client.wait_for("r", timeout=60)

    listed = await client.versions("r")
    compactions = [v for v in listed if v.trigger != "rewind"]
    assert compactions
    assert all(v.in_effect and v.tokens_after < v.tokens_before for v in compactions)
    assert [v.version for v in listed] == list(range(1, len(listed) + 1))
    assert listed[0].replaced_through_n > 0

    for expected in reversed(compactions):
        rewound = await client.rewind("r")
        assert rewound.rewound_version == expected.version
    after = await client.versions("r")
    assert not any(v.in_effect for v in after)
    assert [v.rewound_version for v in after[len(listed) :]] == [v.version for v in reversed(compactions)]

    messages = await client.messages("r")
    transcript = [r["m"] for r in await client.transcript("r")]
    assert [m["role"] for m in messages][:1] == ["system"]
    assert [dict(m) for m in messages[1:]] == [public_message(m) for m in transcript]
    with pytest.raises(RewindError, match="nothing to undo"):
        await client.rewind("r")
