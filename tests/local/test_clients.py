"""Which Kafka clients the embedded broker serves: aiokafka and kafka-python producers publish turns a worker stores.

librdkafka clients (kcat, confluent-kafka) cannot talk to it (a malformed ApiVersions
reply); ``run`` and the README say so. These tests pin what does work.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer

from compaction_worker.client.client import Client
from compaction_worker.errors import ConfigError
from compaction_worker.local.embedded import EmbeddedKafka
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_bytes
from tests.integration.helpers import poll_until
from tests.orchestration import make_settings

with warnings.catch_warnings():
    # kafka-python 3.0 reads its protocol schemas through importlib.resources' deprecated API.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer  # type: ignore[import-untyped]  # kafka-python ships no type hints

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedded_bootstrap() -> Iterator[str]:
    """The embedded broker itself (not whatever broker the session fixture found)."""
    server = EmbeddedKafka()
    try:
        server.start()
    except ConfigError as e:
        pytest.skip(str(e))
    try:
        yield server.bootstrap_servers
    finally:
        server.close()


@pytest.fixture
async def settings_on_embedded(embedded_bootstrap: str, redis_url: str) -> Settings:
    """Worker settings on the embedded broker, with this test's own topics."""
    suffix = uuid.uuid4().hex[:8]
    names = [f"{name}-{suffix}" for name in ("turns", "started", "completed", "dlq")]
    settings = make_settings(embedded_bootstrap, redis_url, names)
    await ensure_topics(settings)
    return settings


async def _publish_with_aiokafka(bootstrap: str, topic: str, key: str, payload: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, payload, key=key.encode())
    finally:
        await producer.stop()


def _publish_with_kafka_python(bootstrap: str, topic: str, key: str, payload: bytes) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=20_000)
    try:
        producer.send(topic, payload, key=key.encode()).get(timeout=30)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


async def test_aiokafka_and_kafka_python_turns_are_stored(settings_on_embedded: Settings) -> None:
    """A turn from each client reaches the worker through the embedded broker and lands in Redis."""
    settings = settings_on_embedded
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.topics.turns
    assert bootstrap
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings, kafka=False) as client:
        await _publish_with_aiokafka(
            bootstrap,
            topic,
            "from-aiokafka",
            turn_bytes("from-aiokafka", 1, [{"role": "user", "content": "hello from aiokafka"}]),
        )
        await asyncio.to_thread(
            _publish_with_kafka_python,
            bootstrap,
            topic,
            "from-kafka-python",
            turn_bytes("from-kafka-python", 1, [{"role": "user", "content": "hi, kp"}]),
        )

        async def stored() -> bool:
            # transcript() raises ConversationNotFound until a turn is stored: ask whether one is.
            return all([await client.exists(cid) for cid in ("from-aiokafka", "from-kafka-python")])

        await poll_until(stored, within=60, what="both turns stored")
        aio, kp = [await client.transcript(cid) for cid in ("from-aiokafka", "from-kafka-python")]
        assert [r["m"]["content"] for r in aio] == ["hello from aiokafka"]
        assert [r["m"]["content"] for r in kp] == ["hi, kp"]
