"""The client for agent runtimes: publish turns, read the effective history back.

A runtime publishes each turn with :meth:`Client.publish_turn` and, before each model
call, sends :meth:`Client.messages` (the rendered effective history) instead of its own
copy. Both sides only need the same settings as the worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from compaction_worker.connections import connect_redis, kafka_client_args
from compaction_worker.errors import ConfigError
from compaction_worker.events import CompactionMode, CompactionRequest, TurnEvent
from compaction_worker.history import render
from compaction_worker.settings import Settings
from compaction_worker.store import Meta, Snapshot, Store


class Client:
    """Publishes turns to Kafka and reads conversations from Redis."""

    def __init__(self, settings: Settings, store: Store, producer: AIOKafkaProducer | None) -> None:
        self.settings = settings
        self.store = store
        self.producer = producer

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, settings: Settings, *, kafka: bool = True) -> AsyncIterator[Client]:
        """Open the Redis connection (and a Kafka producer unless ``kafka=False``)."""
        redis: Redis = connect_redis(settings.redis)
        producer: AIOKafkaProducer | None = None
        try:
            if kafka:
                if not settings.kafka.bootstrap_servers:
                    raise ConfigError(
                        "no Kafka bootstrap servers configured (COMPACTION_KAFKA__BOOTSTRAP_SERVERS)"
                    )
                producer = AIOKafkaProducer(
                    bootstrap_servers=settings.kafka.bootstrap_servers,
                    enable_idempotence=settings.kafka.enable_idempotence,
                    acks="all",
                    max_request_size=max(settings.kafka.max_event_bytes * 2, 1_048_576),
                    **kafka_client_args(settings.kafka),
                )
                await producer.start()
            yield cls(
                settings, Store(redis, settings.redis.key_prefix, settings.redis.retention_seconds), producer
            )
        finally:
            if producer is not None:
                await producer.stop()
            await redis.aclose()

    async def publish_turn(self, event: TurnEvent) -> None:
        """Publish one turn, keyed by its conversation so the conversation stays ordered."""
        await self.publish_raw(
            event.model_dump_json(exclude_none=True).encode(), event.conversation_id.encode()
        )

    async def publish_raw(self, payload: bytes, key: bytes | None) -> None:
        """Publish bytes as they are to the turns topic (tools and tests use this for bad input)."""
        if self.producer is None:
            raise ConfigError("this client was opened without Kafka")
        await self.producer.send_and_wait(self.settings.topics.turns, payload, key=key)

    async def request_compaction(
        self, conversation_id: str, turn_seq: int, model: str, error: str | None = None
    ) -> TurnEvent:
        """Publish a turn with no messages that asks for a manual or (with ``error``) reactive compaction."""
        mode = CompactionMode.OVERFLOW if error else CompactionMode.FORCE
        event = TurnEvent(
            conversation_id=conversation_id,
            turn_seq=turn_seq,
            model=model,
            compaction=CompactionRequest(mode=mode, error=error),
        )
        await self.publish_turn(event)
        return event

    async def snapshot(self, conversation_id: str) -> Snapshot:
        """Metadata and the effective history, read consistently."""
        return await self.store.snapshot(conversation_id)

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        """The provider-ready messages to send to the model next (with the configured summary placement)."""
        history = (await self.store.snapshot(conversation_id)).history
        return render(history, self.settings.pipeline.summary_placement)

    async def meta(self, conversation_id: str) -> Meta:
        """The conversation's metadata (last seq, token totals, version)."""
        return await self.store.meta(conversation_id)

    async def transcript(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every message ever appended, as records ``{"n", "seq", "m", "at"}``."""
        return await self.store.transcript(conversation_id)

    async def compactions(self, conversation_id: str) -> list[dict[str, Any]]:
        """The log of committed compactions."""
        return await self.store.compactions(conversation_id)


def transcript_messages(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages of transcript records, in order."""
    return [r["m"] for r in records]
