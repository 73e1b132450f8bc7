"""The turns consumer's batch handling: per-partition commits, rewinds, and each conversation's order.

A fake turn handler stands in for Redis (its failures are the infrastructure's); the worker's
real handling of a batch is in test_worker.py, a real broker's in tests/integration.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.exceptions
from aiokafka import ConsumerRecord, TopicPartition

from compaction_worker.runtime.consumer import INFRA_ERRORS, Record, conversations, handle_batch

TOPIC = "turns"


def record(partition: int, offset: int, key: bytes | None, value: bytes = b"{}") -> Record:
    size = len(key) if key is not None else -1
    return ConsumerRecord(TOPIC, partition, offset, 0, 0, key, value, None, size, len(value), [])


def batch(partition: int, keys: list[bytes | None], start: int = 0) -> dict[TopicPartition, list[Record]]:
    return {TopicPartition(TOPIC, partition): [record(partition, start + i, k) for i, k in enumerate(keys)]}


class Handler:
    """Records what it handled, in order; fails (as a Redis outage) on the offsets given."""

    def __init__(self, fail: frozenset[tuple[int, int]] = frozenset(), jitter: float = 0.0) -> None:
        self.fail = fail
        self.jitter = jitter
        self.handled: list[tuple[int, int, bytes | None]] = []
        self.running = 0
        self.most_at_once = 0

    async def __call__(self, r: Record) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
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
    random.seed(7)
    keys: list[bytes | None] = [f"c{i % 7}".encode() for i in range(70)]
    handler = Handler(jitter=0.003)
    await handle_batch(batch(0, keys), handler, asyncio.Semaphore(4))
    for cid in set(keys):
        offsets = [offset for _, offset, key in handler.handled if key == cid]
        assert offsets == sorted(offsets)
        assert len(offsets) == 10
    assert handler.most_at_once == 4, "conversations did not run concurrently (or over the limit)"


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


async def test_a_bug_is_redelivered_like_an_outage() -> None:
    """An unexpected exception is not a reason to skip a turn: it comes back too."""

    async def broken(r: Record) -> None:
        raise RuntimeError("bug")

    result = await handle_batch(batch(0, [b"a"]), broken, asyncio.Semaphore(1))
    assert (result.commits, result.rewinds) == ({}, {TopicPartition(TOPIC, 0): 0})


async def test_a_cancelled_batch_commits_nothing() -> None:
    """Shut down mid-batch: the cancellation is not taken for a turn's failure; nothing is committed."""
    handler = Handler(jitter=0.05)
    task = asyncio.create_task(handle_batch(batch(0, [b"a", b"b"]), handler, asyncio.Semaphore(2)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ConnectionError("connection refused"),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.SlotNotCoveredError("slot 1234 is not covered"),
        redis.exceptions.TryAgainError("TRYAGAIN"),
    ],
)
def test_a_single_server_or_cluster_outage_is_an_infrastructure_error(error: Exception) -> None:
    """Logged as an outage (a warning), not as a bug with its traceback; a bad reply is not one."""
    assert isinstance(error, INFRA_ERRORS)
    assert not isinstance(redis.exceptions.ResponseError("WRONGTYPE"), INFRA_ERRORS)
