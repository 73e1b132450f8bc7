"""The worker's channels on FastStream: what the app declares is what the committed AsyncAPI document says.

The publishers are the ones the worker sends through; the turns subscriber is declared for
the document only, on a broker that is never connected, so FastStream consumes nothing.
"""

from __future__ import annotations

import redis.asyncio
import yaml
from faststream.kafka import KafkaBroker, TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage

from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    PROPOSED_TOPIC,
    STARTED_TOPIC,
    TURNS_TOPIC,
)
from compaction_worker.runtime.channels import committed_document, declare, document, make_broker
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import KafkaSettings, TopicSettings
from tests.contracts.helpers import SCHEMAS_DIR
from tests.orchestration import make_settings

RENAMED = TopicSettings(
    turns="prod.turns",
    started="prod.started",
    completed="prod.completed",
    proposed="prod.proposed",
    dlq="prod.dlq",
)


def test_the_committed_document_is_the_worker_apps_own(redis_client: redis.asyncio.Redis) -> None:
    """A worker built on the default topics generates, through its FastStream app, the committed file."""
    settings = make_settings(kafka={"bootstrap_servers": "localhost:9092"})
    assert settings.topics == TopicSettings()
    worker = build_worker(settings, redis_client=redis_client)
    generated = document(worker.app.schema, settings.topics)
    assert generated == yaml.safe_load((SCHEMAS_DIR / "asyncapi.yaml").read_text())
    assert committed_document() == (SCHEMAS_DIR / "asyncapi.yaml").read_text()


def test_the_turns_subscriber_is_on_no_broker_that_runs() -> None:
    """The runtime broker has publishers only: FastStream starts no consumer; the document still receives turns."""
    kafka = KafkaSettings()
    broker = make_broker(kafka)
    channels = declare(broker, TopicSettings(), kafka)
    assert broker.subscribers == []
    assert sorted(channels.publishers) == sorted([STARTED_TOPIC, COMPLETED_TOPIC, PROPOSED_TOPIC, DLQ_TOPIC])
    operations = document(channels.specification, TopicSettings())["operations"]
    assert operations[TURNS_TOPIC]["action"] == "receive"


def test_renamed_topics_move_the_addresses_not_the_names() -> None:
    """Addresses follow the settings; channels keep their default names, keys and headers."""
    kafka = KafkaSettings(bootstrap_servers="kafka-1:9092")
    generated = document(declare(make_broker(kafka), RENAMED, kafka).specification, RENAMED)
    addresses = {name: channel["address"] for name, channel in generated["channels"].items()}
    assert addresses == {
        TURNS_TOPIC: "prod.turns",
        STARTED_TOPIC: "prod.started",
        COMPLETED_TOPIC: "prod.completed",
        PROPOSED_TOPIC: "prod.proposed",
        DLQ_TOPIC: "prod.dlq",
    }
    (server,) = generated["servers"].values()
    assert server["host"] == "kafka-1:9092"
    for message in generated["components"]["messages"].values():
        assert "key" in message["bindings"]["kafka"]
        assert "traceparent" in message["headers"]["properties"]


async def test_a_declared_publisher_sends_to_its_renamed_topic_with_key_and_headers() -> None:
    """What the document calls a channel's address is where the worker's publisher sends."""
    kafka = KafkaSettings()
    broker = make_broker(kafka)
    channels = declare(broker, RENAMED, kafka)
    received: list[KafkaMessage] = []

    @broker.subscriber("prod.completed")
    async def completed(message: KafkaMessage) -> None:
        received.append(message)

    async with TestKafkaBroker(broker):
        publisher = channels.publishers["prod.completed"]
        await publisher.publish(
            b"{}", key=b"c-1", headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        )
    (message,) = received
    assert message.raw_message.key == b"c-1"  # type: ignore[union-attr]  # one record, not a batch
    assert message.headers["traceparent"].startswith("00-")
    assert message.correlation_id  # FastStream's header, which the document names as correlationId


def test_the_document_broker_is_a_separate_one(redis_client: redis.asyncio.Redis) -> None:
    """The worker's app runs one broker; the turns subscriber lives on another, which nothing starts."""
    worker = build_worker(
        make_settings(kafka={"bootstrap_servers": "localhost:9092"}), redis_client=redis_client
    )
    assert worker.app.brokers == [worker.broker]
    documented = [b for b in worker.app.schema.brokers if b is not worker.broker]  # type: ignore[attr-defined]
    assert len(documented) == 1
    assert isinstance(documented[0], KafkaBroker)
    assert [s.specification.topics for s in documented[0].subscribers] == [[TURNS_TOPIC]]  # type: ignore[attr-defined]
