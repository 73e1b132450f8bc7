"""The bench's bare loops: the worker's own fetch settings, and one script call per event, awaited or pipelined."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from compaction_worker.bench.bare import STORE, BareLoop, consumer_args
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.runtime.consumer import TurnConsumer
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient

FETCH = (
    "_group_id",
    "_auto_offset_reset",
    "_enable_auto_commit",
    "_session_timeout_ms",
    "_heartbeat_interval_ms",
    "_max_partition_fetch_bytes",
    "_fetch_max_wait_ms",
    "_fetch_max_bytes",
    "_fetch_min_bytes",
    "_max_poll_records",
)
"""aiokafka's names for what a consumer is told at construction (fetch, session, commit)."""


async def _nothing(_record: object) -> None:
    return None


async def test_the_bare_loop_fetches_with_the_workers_consumer_settings() -> None:
    """Compared field by field with the worker's own consumer, built from unusual settings."""
    settings = Settings(
        kafka={
            "bootstrap_servers": "localhost:9",
            "group_id": "g",
            "session_timeout_ms": 12_345,
            "heartbeat_interval_ms": 2_345,
            "fetch_max_wait_ms": 77,
            "max_event_bytes": 3 << 20,
        }
    )
    worker = TurnConsumer(settings, _nothing)._consumer(asyncio.Lock())
    bare = AIOKafkaConsumer(settings.topics.turns, **consumer_args(settings))
    try:
        assert {name: getattr(bare, name) for name in FETCH} == {
            name: getattr(worker, name) for name in FETCH
        }
        assert bare._client._client_id == worker._client._client_id
        assert bare._fetch_max_wait_ms == 77
    finally:
        await asyncio.gather(bare.stop(), worker.stop())


def _batch(events: list[tuple[str, int]]) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    """Two partitions' records: (conversation, seq) each, a conversation's in order on one partition."""
    batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    for offset, (cid, seq) in enumerate(events):
        tp = TopicPartition("turns", hash(cid) % 2)
        key, value = cid.encode(), f"{cid}:{seq}".encode()
        batch.setdefault(tp, []).append(
            ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, key, value, None, len(key), len(value), [])
        )
    return batch


@pytest.mark.integration
@pytest.mark.parametrize("pipelined", [False, True], ids=["awaited", "pipelined"])
async def test_each_event_is_stored_in_order_and_counted_as_its_conversations_last_seq(
    redis_client: RedisClient, pipelined: bool
) -> None:
    settings = Settings(redis={"key_prefix": "bare"})
    sha = str(await redis_client.script_load(STORE))
    loop = BareLoop(settings, redis_client, sha, pipelined=pipelined)
    events = [(f"c{i}", seq) for seq in range(1, 4) for i in range(5)]
    await loop.handle(_batch(events))
    for i in range(5):
        keys = conversation_keys(f"c{i}", "bare")
        assert await redis_client.lrange(keys.transcript, 0, -1) == [f"c{i}:{s}".encode() for s in (1, 2, 3)]
        assert await redis_client.hget(keys.meta, "last_seq") == b"3"
