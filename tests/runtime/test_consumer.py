"""The turns consumer's batch handling: per-partition commits, rewinds, and each conversation's order.

A fake turn handler stands in for Redis (its failures are the infrastructure's); the worker's
real handling of a batch is in test_worker.py, a real broker's in tests/integration.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping

import pytest
import redis.exceptions
from aiokafka import ConsumerRecord, TopicPartition

from compaction_worker.runtime import consumer
from compaction_worker.runtime.consumer import Record, TurnConsumer, conversations, handle_batch
from tests.orchestration import make_settings

TOPIC = "turns"


def record(partition: int, offset: int, key: bytes | None, value: bytes = b"{}") -> Record:
    size = len(key) if key is not None else -1
    return ConsumerRecord(TOPIC, partition, offset, 0, 0, key, value, None, size, len(value), [])


def batch(partition: int, keys: list[bytes | None], start: int = 0) -> dict[TopicPartition, list[Record]]:
    return {TopicPartition(TOPIC, partition): [record(partition, start + i, k) for i, k in enumerate(keys)]}


class Handler:
    """Records what it handled, in order; fails (as a Redis outage) on the offsets given.

    Its first ``together`` calls wait for each other (a barrier) before they go on: they
    can only return if that many run at once.
    """

    def __init__(
        self, fail: frozenset[tuple[int, int]] = frozenset(), jitter: float = 0.0, together: int = 1
    ) -> None:
        self.fail = fail
        self.jitter = jitter
        self.handled: list[tuple[int, int, bytes | None]] = []
        self.running = 0
        self.most_at_once = 0
        self.barrier = asyncio.Barrier(together)
        self.waiting_at_barrier = together

    async def __call__(self, r: Record) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if self.waiting_at_barrier:
                self.waiting_at_barrier -= 1
                await self.barrier.wait()
            await asyncio.sleep(random.uniform(0, self.jitter))
            if (r.partition, r.offset) in self.fail:
                raise redis.exceptions.ConnectionError("Redis is down")
            self.handled.append((r.partition, r.offset, r.key))
        finally:
            self.running -= 1


def test_conversations_group_by_key_in_offset_order() -> None:
    records = batch(0, [b"a", b"b", b"a", None, b"b", None])[TopicPartition(TOPIC, 0)]
    groups = [[r.offset for r in g] for g in conversations(records)]
    assert groups == [[0, 2], [1, 4], [3, 5]]


async def test_a_whole_batch_commits_past_its_last_offset() -> None:
    handler = Handler()
    result = await handle_batch(batch(0, [b"a", b"b", b"a"], start=10), handler, asyncio.Semaphore(4))
    assert (result.commits, result.rewinds, result.handled) == ({TopicPartition(TOPIC, 0): 13}, {}, 3)


async def test_each_conversation_keeps_its_order_while_conversations_run_concurrently() -> None:
    """Seven conversations, four at once: the first four turns wait for each other, so a batch
    handled one conversation at a time never ends (the timeout fails it); one that ignores the
    limit runs more than four."""
    random.seed(7)
    keys: list[bytes | None] = [f"c{i % 7}".encode() for i in range(70)]
    handler = Handler(jitter=0.003, together=4)
    async with asyncio.timeout(30):  # only a failing run waits for it: four never meet
        await handle_batch(batch(0, keys), handler, asyncio.Semaphore(4))
    for cid in set(keys):
        offsets = [offset for _, offset, key in handler.handled if key == cid]
        assert offsets == sorted(offsets)
        assert len(offsets) == 10
    assert handler.most_at_once == 4, "conversations ran over the limit"


async def test_an_outage_mid_batch_commits_only_before_the_first_failure() -> None:
    """Offset 3 (conversation b) fails: b's later turns wait; a's run; the commit stops at 3; rewind to 3."""
    handler = Handler(fail=frozenset({(0, 3)}))
    keys: list[bytes | None] = [b"a", b"b", b"a", b"b", b"a", b"b"]
    result = await handle_batch(batch(0, keys), handler, asyncio.Semaphore(4))
    tp = TopicPartition(TOPIC, 0)
    assert (result.commits, result.rewinds) == ({tp: 3}, {tp: 3})
    assert sorted(o for _, o, _ in handler.handled) == [0, 1, 2, 4], "b's turn 5 ran before its turn 3"
    assert isinstance(result.error, redis.exceptions.ConnectionError)


async def test_a_failure_at_the_start_commits_nothing_and_other_partitions_go_on() -> None:
    handler = Handler(fail=frozenset({(0, 5)}))
    both = {**batch(0, [b"a", b"a"], start=5), **batch(1, [b"c", b"d"], start=40)}
    result = await handle_batch(both, handler, asyncio.Semaphore(4))
    assert result.commits == {TopicPartition(TOPIC, 1): 42}
    assert result.rewinds == {TopicPartition(TOPIC, 0): 5}
    assert result.handled == 2


async def test_whatever_the_handler_lets_through_comes_back() -> None:
    """The handler raises only what must come back (an outage: it dead-letters a poison turn
    itself, after bounded retries, runtime/turns.py); the batch never skips such a turn."""

    async def broken(r: Record) -> None:
        raise redis.exceptions.TimeoutError("Redis did not answer")

    result = await handle_batch(batch(0, [b"a"]), broken, asyncio.Semaphore(1))
    assert (result.commits, result.rewinds) == ({}, {TopicPartition(TOPIC, 0): 0})


# --- the consume loop: what a handled batch is committed and logged as ----------------


class FakeKafka:
    """Stands in for each ``AIOKafkaConsumer`` of a TurnConsumer: hands out the batches given,
    then none; records commits and seeks."""

    def __init__(self, *batches: Mapping[TopicPartition, list[Record]]) -> None:
        self.batches = list(batches)
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.drained = asyncio.Event()
        """Set when a fetch finds no batch left: the loop is done with every batch before it."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, timeout_ms: int, max_records: int) -> Mapping[TopicPartition, list[Record]]:
        if self.batches:
            return self.batches.pop(0)
        self.drained.set()
        await asyncio.sleep(timeout_ms / 1000)
        return {}

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def highwater(self, tp: TopicPartition) -> int | None:
        return None


async def start_consuming(
    monkeypatch: pytest.MonkeyPatch, kafka: FakeKafka, handle: consumer.Handle
) -> TurnConsumer:
    """A started TurnConsumer (one consumer, no backoff to speak of) whose consumer is ``kafka``."""
    monkeypatch.setattr(TurnConsumer, "_consumer", lambda self, busy: kafka)
    settings = make_settings(kafka={"consumers": 1}, retry={"base_seconds": 0.01, "cap_seconds": 0.01})
    turns = TurnConsumer(settings, handle)
    await turns.start()
    return turns


async def test_a_cancelled_batch_commits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shut down mid-batch: the batch before it is committed; of this one, with a turn handled
    and one still running, nothing is (the cancellation is not taken for a turn's failure)."""
    tp = TopicPartition(TOPIC, 0)
    kafka = FakeKafka(batch(0, [b"a"]), batch(0, [b"a", b"b"], start=1))
    handled: list[int] = []
    stuck = asyncio.Event()

    async def handle(r: Record) -> None:
        if r.key == b"b":
            stuck.set()
            await asyncio.Event().wait()  # until cancelled
        handled.append(r.offset)

    turns = await start_consuming(monkeypatch, kafka, handle)
    try:
        async with asyncio.timeout(30):
            await stuck.wait()
    finally:
        await turns.stop(grace=0)

    assert handled == [0, 1], "the second batch was not partly handled"
    assert kafka.commits == [{tp: 1}]
    assert kafka.seeks == []


OUTAGES = [
    redis.exceptions.ConnectionError("connection refused"),
    redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    redis.exceptions.SlotNotCoveredError("slot 1234 is not covered"),
    redis.exceptions.TryAgainError("TRYAGAIN"),
]


async def logged_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> tuple[logging.LogRecord, FakeKafka]:
    """What the consume loop logs for one turn whose handling raises ``error``; and its FakeKafka."""
    kafka = FakeKafka(batch(0, [b"a"], start=5))

    async def handle(r: Record) -> None:
        raise error

    caplog.set_level(logging.WARNING, logger=consumer.__name__)
    turns = await start_consuming(monkeypatch, kafka, handle)
    try:
        async with asyncio.timeout(30):
            await kafka.drained.wait()
    finally:
        await turns.stop(grace=0)
    (logged,) = [r for r in caplog.records if r.name == consumer.__name__]
    return logged, kafka


@pytest.mark.parametrize("error", OUTAGES, ids=[type(e).__name__ for e in OUTAGES])
async def test_a_single_server_or_cluster_outage_is_logged_as_an_outage(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    """A warning naming the error, without a traceback; the turn is rewound, nothing committed."""
    logged, kafka = await logged_failure(monkeypatch, caplog, error)

    assert (logged.levelno, logged.exc_info) == (logging.WARNING, None)
    assert logged.getMessage().startswith(f"infrastructure error on a turn ({type(error).__name__}: ")
    assert "1 turn(s) will be redelivered" in logged.getMessage()
    assert (kafka.commits, kafka.seeks) == ([], [(TopicPartition(TOPIC, 0), 5)])


async def test_a_bad_reply_is_logged_as_a_bug_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answering WRONGTYPE is not an outage: an error, with the traceback."""
    error = redis.exceptions.ResponseError("WRONGTYPE")

    logged, _ = await logged_failure(monkeypatch, caplog, error)

    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None
    assert logged.exc_info[1] is error
