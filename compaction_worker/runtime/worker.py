"""The worker process: a FastStream Kafka app over the wired components.

A turn is acknowledged once stored or dead-lettered; an infrastructure error is not, so
the turn comes back. Compactions run on the pool, off the consumer path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import redis.exceptions
from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from redis.asyncio import Redis

from compaction_worker.runtime.compactor import Summarizers
from compaction_worker.runtime.components import Components, build_components
from compaction_worker.runtime.connections import connect_redis, kafka_security
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.runtime.turns import TurnHandler, TurnOutcome
from compaction_worker.settings import Settings
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)

# Errors that mean "the infrastructure is down", not "this event is bad".
INFRA_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    OSError,
)


@dataclass
class Worker:
    """One worker process: its components, broker and Redis client; ``app`` is the FastStream application."""

    settings: Settings
    broker: KafkaBroker
    redis: Redis
    components: Components
    app: FastStream
    handled: int = 0

    @property
    def store(self) -> Store:
        return self.components.store

    @property
    def turns(self) -> TurnHandler:
        return self.components.turns

    @property
    def pool(self) -> CompactionPool:
        return self.components.pool

    async def serve(self) -> None:
        """Run until SIGINT/SIGTERM, then shut down gracefully."""
        await self.app.run()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Worker]:
        """Run inside an ``async with`` block (the demo and tests): start, yield, stop."""
        async with self.app.lifespan_context():
            await self.app.start()
            try:
                yield self
            finally:
                await self.app.stop()

    def __repr__(self) -> str:
        return f"<Worker handled={self.handled} {self.pool!r} {self.turns.gaps!r}>"


def build_worker(
    settings: Settings,
    summarizers: Summarizers | None = None,
    redis_client: Redis | None = None,
    on_turn: Callable[[TurnOutcome], None] | None = None,
) -> Worker:
    """Wire a worker from settings: broker, Redis, the components, the subscriber and the app."""
    kafka = settings.kafka
    if not kafka.bootstrap_servers:
        raise ValueError("no Kafka bootstrap servers configured")
    broker = KafkaBroker(
        kafka.bootstrap_servers,
        client_id=kafka.client_id,
        enable_idempotence=kafka.enable_idempotence,
        acks="all",
        security=kafka_security(kafka),
        logger=logging.getLogger("compaction_worker.broker"),
        log_level=logging.DEBUG,  # one line per message is too much at INFO
        graceful_timeout=settings.worker.shutdown_grace_seconds,
    )
    client = redis_client or connect_redis(settings.redis)

    async def publish(topic: str, payload: bytes, key: bytes | None) -> None:
        await broker.publish(payload, topic, key=key, headers={"content-type": "application/json"})

    parts = build_components(settings, client, publish, summarizers=summarizers)
    turns, pool = parts.turns, parts.pool

    subscriber = broker.subscriber(
        settings.topics.turns,
        group_id=kafka.group_id,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        max_workers=kafka.consumers,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        max_partition_fetch_bytes=kafka.max_fetch_bytes,
        decoder=_raw_body,
        title="conversation.turn",
        description="One turn of one conversation, keyed by conversation_id.",
    )

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        await client.ping()
        pool.start()
        try:
            yield
        finally:
            await client.aclose()

    app = FastStream(broker, lifespan=lifespan)
    worker = Worker(settings, broker, client, parts, app)

    @subscriber
    async def consume_turn(message: KafkaMessage) -> None:
        record = message.raw_message
        assert not isinstance(record, tuple), "the turn subscriber is not a batch subscriber"
        raw = record.value if isinstance(record.value, bytes) else bytes(record.value or b"")
        try:
            outcome = await turns.handle(raw, record.key, record.partition, record.offset)
        except INFRA_ERRORS:
            # Not acknowledged: the event is redelivered. Pause so a Redis outage is not a hot loop.
            log.warning("infrastructure error on a turn; it will be redelivered", exc_info=True)
            await asyncio.sleep(settings.worker.retry_backoff_seconds)
            raise
        worker.handled += 1
        if on_turn is not None:
            on_turn(outcome)

    @app.on_shutdown
    async def drain() -> None:
        # Stop taking turns first, then give running compactions the grace period; the
        # broker is still up so their events are published.
        await subscriber.stop()
        await pool.stop(settings.worker.shutdown_grace_seconds)

    return worker


async def _raw_body(message: Any) -> bytes:
    """Keep the body as bytes: the handler validates it itself, so bad JSON can be dead-lettered."""
    body = message.body
    return body if isinstance(body, bytes) else bytes(body or b"")
