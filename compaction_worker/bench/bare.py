"""The bare loops: the floor the broker and Redis allow with the worker's own fetch settings, and none of its logic.

Both run ``kafka.consumers`` consumers in one process, created with the worker's consumer
settings (session and heartbeat, ``fetch_max_wait_ms``, ``max_fetch_bytes``) and fetching with
``getmany(timeout_ms=batch_timeout_ms, max_records=batch_max_records)``, and commit once per
batch. For each event they make one Redis script call (append the event to its
conversation's list, count it as the conversation's ``last_seq``, as the worker's meta
does, so that the bench counts both alike):

- the bare loop awaits each call in turn (one round trip per event, ``kafka.consumers`` in
  flight);
- the pipelined bare loop sends a batch's calls in one pipeline (one round trip per batch).

Run as ``python -m compaction_worker.bench.bare [--pipelined]`` with the worker's settings
(``COMPACTION_*``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.runtime.connections import connect_redis, kafka_client_args
from compaction_worker.settings import Settings, load_settings
from compaction_worker.state.connection import RedisClient

STORE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
return redis.call('HINCRBY', KEYS[2], 'last_seq', 1)
"""

Batch = Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]]


def consumer_args(settings: Settings) -> dict[str, Any]:
    """The worker's consumer settings (``runtime/consumer.py``), which a test keeps equal to its own."""
    kafka = settings.kafka
    return {
        "bootstrap_servers": kafka.bootstrap_servers,
        "client_id": kafka.client_id,
        "group_id": kafka.group_id,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_partition_fetch_bytes": kafka.max_fetch_bytes,
        "fetch_max_wait_ms": kafka.fetch_max_wait_ms,
        **kafka_client_args(kafka),
    }


class BareLoop:
    """``kafka.consumers`` consumers storing each event with one script call, awaited or pipelined."""

    def __init__(self, settings: Settings, redis: RedisClient, sha: str, *, pipelined: bool) -> None:
        self.settings, self.redis, self.sha, self.pipelined = settings, redis, sha, pipelined

    def _call(self, record: ConsumerRecord[bytes, bytes]) -> tuple[str, int, str, str, bytes]:
        """``EVALSHA``'s arguments for one event: its conversation's list and meta, and the event."""
        keys = conversation_keys((record.key or b"").decode(), self.settings.redis.key_prefix)
        return self.sha, 2, keys.transcript, keys.meta, record.value or b""

    async def handle(self, batch: Batch) -> None:
        """Store a fetched batch: one awaited call per event, or one pipeline for the whole batch."""
        records = [record for partition in batch.values() for record in partition]
        if not self.pipelined:
            for record in records:
                await self.redis.execute_command("EVALSHA", *self._call(record))
            return
        pipe = self.redis.pipeline(transaction=False)
        for record in records:
            pipe.execute_command("EVALSHA", *self._call(record))
        await pipe.execute()

    async def consume(self, consumer: AIOKafkaConsumer) -> None:
        kafka = self.settings.kafka
        while True:
            batch = await consumer.getmany(
                timeout_ms=kafka.batch_timeout_ms, max_records=kafka.batch_max_records
            )
            if batch:
                await self.handle(batch)
                await consumer.commit()

    async def run(self) -> None:
        """Join the group with every consumer at once (as the worker does) and consume until cancelled."""
        consumers = [
            AIOKafkaConsumer(self.settings.topics.turns, **consumer_args(self.settings))
            for _ in range(self.settings.kafka.consumers)
        ]
        await asyncio.gather(*(c.start() for c in consumers))
        kind = "pipelined bare loop" if self.pipelined else "bare loop"
        print(
            f"worker consuming {self.settings.topics.turns} ({kind}, {len(consumers)} consumers)", flush=True
        )
        try:
            await asyncio.gather(*(self.consume(c) for c in consumers))
        finally:
            await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)


async def bare_loop(settings: Settings, *, pipelined: bool = False) -> None:
    """Consume until cancelled: one script call per event, one commit per batch."""
    redis = connect_redis(settings.redis)
    try:
        sha = str(await redis.script_load(STORE))  # on every primary of a cluster
        await BareLoop(settings, redis, sha, pipelined=pipelined).run()
    finally:
        await redis.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelined", action="store_true", help="one Redis pipeline per fetched batch")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bare_loop(load_settings(), pipelined=args.pipelined))
