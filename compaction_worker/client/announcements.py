"""What wakes a waiting client: events keyed by its conversation on ``compaction.completed`` and the
dead-letter topic.

A group-less consumer at the topics' end, one per wait: no group to join or rebalance, no offsets
left behind, and every waiter sees every event. Keyspace notifications were the other way; they need
server configuration that managed Redis often forbids.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from compaction_worker.errors import ConfigError
from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.settings import Settings

FIRST_RECHECK = 0.02
LAST_RECHECK = 1.0
"""Seconds between Redis reads while waiting: short after an announcement, doubling to this."""


class Announcements:
    """A group-less consumer of ``compaction.completed`` (and the dead-letter topic, when it exists)
    from their end: one per wait."""

    def __init__(self, settings: Settings) -> None:
        if not settings.kafka.bootstrap_servers:
            raise ConfigError("no Kafka bootstrap servers configured (COMPACTION_KAFKA__BOOTSTRAP_SERVERS)")
        self.topic = settings.topics.completed
        self.dlq = settings.topics.dlq
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            **kafka_client_args(settings.kafka),
        )

    async def start(self) -> None:
        """Connect and fix the position at the end of every partition (not only the key's:
        the worker's partitioner is not ours to assume)."""
        await self.consumer.start()
        await self.consumer.topics()  # metadata, so the partitions are known
        partitions = self.consumer.partitions_for_topic(self.topic)
        if not partitions:
            raise ConfigError(f"topic {self.topic} does not exist: the worker creates it when it starts")
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        # A rejection wakes the wait too; without the topic, the wait reads Redis now and then.
        assigned += [
            TopicPartition(self.dlq, p) for p in sorted(self.consumer.partitions_for_topic(self.dlq) or ())
        ]
        self.consumer.assign(assigned)
        await self.consumer.seek_to_end(*assigned)
        for tp in assigned:
            await self.consumer.position(tp)  # resolves the end offset now, not at the first fetch

    async def seen(self, key: bytes, within: float) -> bool:
        """Whether an event keyed ``key`` arrives within ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while (left := deadline - loop.time()) > 0:
            batch = await self.consumer.getmany(timeout_ms=max(1, int(left * 1000)))
            if any(r.key == key for records in batch.values() for r in records):
                return True
        return False

    async def stop(self) -> None:
        await self.consumer.stop()
