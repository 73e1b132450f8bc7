"""The bare loop: the floor the broker and Redis allow, with none of the worker's logic.

It consumes the turns topic with aiokafka, makes one Redis script call per event (append the
event to its conversation's list, count it as the conversation's ``last_seq``, as the worker's
meta does, so that the bench counts both alike) and commits once per batch. Run as
``python -m compaction_worker.bench.bare`` with the worker's settings (``COMPACTION_*``).
"""

from __future__ import annotations

import asyncio
import contextlib

import click
from aiokafka import AIOKafkaConsumer

from compaction_worker.runtime.connections import connect_redis, kafka_client_args
from compaction_worker.settings import Settings, load_settings
from compaction_worker.state.keys import conversation_keys

STORE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
return redis.call('HINCRBY', KEYS[2], 'last_seq', 1)
"""


async def bare_loop(settings: Settings) -> None:
    """Consume until cancelled: one script call per event, one commit per batch."""
    redis = connect_redis(settings.redis)
    store = redis.register_script(STORE)
    consumer = AIOKafkaConsumer(
        settings.topics.turns,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=settings.kafka.group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kafka_client_args(settings.kafka),
    )
    await consumer.start()
    click.echo(f"worker consuming {settings.topics.turns} as group {settings.kafka.group_id} (bare loop)")
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batches.values():
                for record in records:
                    keys = conversation_keys((record.key or b"").decode(), settings.redis.key_prefix)
                    await store(keys=[keys.transcript, keys.meta], args=[record.value or b""])
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()
        await redis.aclose()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bare_loop(load_settings()))
