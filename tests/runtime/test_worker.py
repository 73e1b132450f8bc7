"""The worker: the compaction pool's graceful stop, and the turn subscriber's acknowledgements.

The pool tests run against the real Redis with a summarizer that waits, so the test decides
when the "LLM call" ends. The subscriber tests run on FastStream's in-memory test broker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from faststream import BaseMiddleware
from faststream.kafka import TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.message import AckStatus, StreamMessage
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import DeadLetter, Outcome
from compaction_worker.local.embedded import free_port
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.runtime.turns import TurnOutcome, TurnStatus
from compaction_worker.runtime.worker import Worker, build_worker
from compaction_worker.settings import Settings
from compaction_worker.summaries.contract import CountTokens, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from tests.orchestration import Parts, Published, compactor_with, conversation, raw, user

COUNT = counter_for("gpt-4o-mini", Settings().budget).text  # the model of orchestration's turns


class Slow(ExtractiveSummarizer):
    """The extractive summary, given only once ``release`` is set; ``asked`` is set on entry."""

    def __init__(self, count_tokens: CountTokens = COUNT) -> None:
        super().__init__(count_tokens)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.asked.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await super().summarize(request)


async def _over_threshold(parts: Parts) -> None:
    for event in conversation(24):
        await parts.turns.handle(event, b"c")
    assert await parts.jobs.pending_count() == 1


def _pool(parts: Parts, published: Published, summarizer: ExtractiveSummarizer) -> CompactionPool:
    compactor = compactor_with(parts, published, lambda _m, _c: [summarizer])
    return CompactionPool(compactor, parts.jobs, size=2, sweep_interval=0.05)


async def test_stop_lets_a_compaction_finish_within_the_grace(parts: Parts, published: Published) -> None:
    """A compaction that ends inside the grace period commits; nothing is handed back."""
    await _over_threshold(parts)
    summarizer = Slow()
    pool = _pool(parts, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)

    stopping = asyncio.create_task(pool.stop(grace=10))
    await asyncio.sleep(0.2)
    assert not stopping.done(), "stop() did not wait for the running compaction"
    summarizer.release.set()
    await asyncio.wait_for(stopping, 10)

    assert (pool.completed, pool.failed, summarizer.cancelled) == (1, 0, False)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await parts.store.meta("c")).version == 1
    assert await parts.jobs.pending_count() == 0


async def test_stop_hands_back_a_compaction_that_outlasts_the_grace(
    parts: Parts, published: Published
) -> None:
    """Past the grace period the compaction is cancelled, its lock released and its job due
    now, so another worker takes it over at once instead of after the lease or the lock TTL."""
    await _over_threshold(parts)
    store, jobs = parts.store, parts.jobs
    keys = store.keys("c")
    summarizer = Slow()
    pool = _pool(parts, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)
    assert await store.redis.exists(keys.lock)

    began = time.monotonic()
    await pool.stop(grace=0.3)
    took = time.monotonic() - began
    assert summarizer.cancelled
    assert 0.3 <= took < 5, took
    assert not pool.tasks
    assert not await store.redis.exists(keys.lock), "the lock outlived the handed-back compaction"
    assert published.on("compaction.completed") == []
    assert (await store.meta("c")).version == 0
    assert await jobs.due(10) == ["c"], "the job is not due again"

    # Another worker's pool finishes it right away.
    other = _pool(parts, published, ExtractiveSummarizer(COUNT))
    assert await other.sweep() == 1
    await asyncio.wait_for(asyncio.gather(*other.tasks.values()), 10)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await store.meta("c")).version == 1
    assert await jobs.pending_count() == 0
    await other.stop(grace=1)


# --- the turn subscriber's acknowledgement contract, in process ------------------------


def recording(messages: list[StreamMessage[Any]]) -> type[BaseMiddleware]:
    """A broker middleware that keeps every consumed message, to read its acknowledgement after."""

    class Record(BaseMiddleware):
        async def consume_scope(
            self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
        ) -> Any:
            messages.append(msg)
            return await call_next(msg)

    return Record


class TestAcknowledgement:
    """The turn subscriber on FastStream's in-memory broker: what is acked, what comes back.

    A turn is acknowledged (its offset committed) only once it is stored or dead-lettered;
    an infrastructure error leaves it unacknowledged (nacked: the consumer seeks back), so
    Kafka delivers it again. The real-broker versions are in tests/integration.
    """

    @pytest.fixture
    def in_process(self, settings: Settings) -> Settings:
        """The test settings with a (never contacted) broker address and a short retry pause."""
        settings.kafka.bootstrap_servers = "in-process:9092"
        settings.worker.retry_backoff_seconds = 0.01
        return settings

    async def _deliver(self, worker: Worker, payload: bytes) -> tuple[StreamMessage[Any], list[bytes]]:
        """Publish one keyed turn through the test broker; the consumed message and any DLQ records."""
        consumed: list[StreamMessage[Any]] = []
        letters: list[bytes] = []
        worker.broker.add_middleware(recording(consumed))

        @worker.broker.subscriber(worker.settings.topics.dlq)
        async def dead_letters(message: KafkaMessage) -> None:
            letters.append(message.body)

        async with TestKafkaBroker(worker.broker) as broker:
            with contextlib.suppress(redis.exceptions.ConnectionError):
                await broker.publish(payload, worker.settings.topics.turns, key=b"c")
        (message,) = [m for m in consumed if m.raw_message.topic == worker.settings.topics.turns]
        return message, letters

    @pytest.mark.integration
    async def test_a_stored_turn_is_acked(
        self, in_process: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """Appended, then acknowledged; nothing goes to the DLQ."""
        outcomes: list[TurnOutcome] = []
        worker = build_worker(in_process, redis_client=redis_client, on_turn=outcomes.append)

        message, letters = await self._deliver(worker, raw("c", 1, user("hello")))

        assert message.committed is AckStatus.ACKED
        assert [o.status for o in outcomes] == [TurnStatus.APPENDED]
        assert (await worker.store.meta("c")).last_seq == 1
        assert (worker.handled, letters) == (1, [])

    @pytest.mark.integration
    async def test_a_bad_turn_is_dead_lettered_then_acked(
        self, in_process: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """Bad JSON: one DLQ record with the original bytes, then acknowledged, so it never blocks the partition."""
        worker = build_worker(in_process, redis_client=redis_client)

        message, letters = await self._deliver(worker, b"{not json")

        assert message.committed is AckStatus.ACKED
        (letter,) = [DeadLetter.model_validate_json(body) for body in letters]
        assert (letter.reason.value, base64.b64decode(letter.original_b64)) == (
            "malformed_json",
            b"{not json",
        )
        assert await redis_client.keys("*") == []
        assert worker.handled == 1

    async def test_a_turn_met_by_a_redis_outage_is_nacked(self, in_process: Settings) -> None:
        """Redis unreachable: not acknowledged (nacked), not dead-lettered; Kafka delivers it again."""
        unreachable = redis.asyncio.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
        worker = build_worker(in_process, redis_client=unreachable)
        try:
            message, letters = await self._deliver(worker, raw("c", 1, user("hello")))
        finally:
            await unreachable.aclose()

        assert message.committed is AckStatus.NACKED
        assert (worker.handled, letters) == (0, [])
