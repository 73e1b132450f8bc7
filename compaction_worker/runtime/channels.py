"""The worker's Kafka channels, declared on FastStream, and the AsyncAPI document FastStream makes of them.

The worker publishes through the publishers declared here (:func:`declare`), so the
document lists what the code sends, with the payload models it sends. The turns topic is
read by the worker's own consumer (consumer.py: FastStream's batch subscriber would flatten
the per-partition batches that its rewind rule needs), so its subscriber is declared on a
second broker that is never connected: it describes the topic and cannot consume. The
committed ``schemas/asyncapi.yaml`` is this document for the default settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from faststream.kafka import KafkaBroker
from faststream.kafka.publisher.usecase import DefaultPublisher
from faststream.specification import AsyncAPI
from faststream.specification.base import SpecificationFactory

from compaction_worker import __version__
from compaction_worker.contracts.asyncapi import (
    HEADERS,
    KAFKA_BINDING_VERSION,
    channel_description,
    info_description,
    key_schema,
    prose,
    render_yaml,
)
from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    EVENT_MODELS,
    PROPOSED_TOPIC,
    STARTED_TOPIC,
    TURNS_TOPIC,
    TurnEvent,
)
from compaction_worker.runtime.connections import kafka_security
from compaction_worker.settings import KafkaSettings, TopicSettings, env_name, literal_values

DOCUMENTED_BOOTSTRAP = "localhost:9092"
"""The server the document names when no bootstrap servers are configured (the committed one)."""

_FIELDS = {
    TURNS_TOPIC: "turns",
    STARTED_TOPIC: "started",
    COMPLETED_TOPIC: "completed",
    PROPOSED_TOPIC: "proposed",
    DLQ_TOPIC: "dlq",
}
"""Each default topic name and the ``topics`` setting that renames it."""


def make_broker(kafka: KafkaSettings, graceful_timeout: float | None = None) -> KafkaBroker:
    """The worker's FastStream broker (not connected): servers, security, producer options."""
    return KafkaBroker(
        kafka.bootstrap_servers or DOCUMENTED_BOOTSTRAP,
        client_id=kafka.client_id,
        enable_idempotence=kafka.enable_idempotence,
        acks="all",
        security=kafka_security(kafka),
        description=_server_description(),
        logger=logging.getLogger("compaction_worker.broker"),
        log_level=logging.DEBUG,  # one line per message is too much at INFO
        graceful_timeout=graceful_timeout,
    )


@dataclass(frozen=True, slots=True)
class Channels:
    """What :func:`declare` puts on a broker: its publishers by topic, and the specification."""

    publishers: dict[str, DefaultPublisher]
    """The started, completed and dead-letter publishers, by the topic each sends to."""
    specification: AsyncAPI
    """FastStream's AsyncAPI factory over the broker's publishers and the turns subscriber."""


async def _turns(event: TurnEvent) -> None:
    """Never called: it gives the turns subscriber its payload model (the consumer reads the topic)."""


def declare(broker: KafkaBroker, topics: TopicSettings, kafka: KafkaSettings) -> Channels:
    """Declare the worker's publishers on ``broker`` and its turns subscriber on a broker never connected."""
    renamed_by = _renamed_by()
    publishers = {
        name: broker.publisher(
            name,
            title=default,
            description=channel_description(default, renamed_by[default]),
            schema=EVENT_MODELS[default],
        )
        for default, name in _addresses(topics).items()
        if default != TURNS_TOPIC
    }
    readers = make_broker(kafka)  # the same server, so that the document names it once
    readers.subscriber(
        topics.turns,
        group_id=kafka.group_id,
        title=TURNS_TOPIC,
        description=channel_description(TURNS_TOPIC, renamed_by[TURNS_TOPIC], kafka.group_id),
    )(_turns)
    specification = AsyncAPI(
        broker,
        readers,
        title="compaction-worker",
        version=__version__,
        description=info_description(renamed_by),
        schema_version="3.0.0",
    )
    return Channels(publishers, specification)


def document(specification: SpecificationFactory, topics: TopicSettings) -> dict[str, Any]:
    """FastStream's AsyncAPI 3.0 document (of :func:`declare`'s channels, or an app's), with each message's key and headers.

    FastStream 0.7's message object has no field for bindings or headers; they are added
    here, to the messages it generated, whose content is otherwise unchanged.
    """
    generated: dict[str, Any] = specification.to_specification().to_jsonable()
    messages = generated["components"]["messages"]
    for default, address in _addresses(topics).items():
        (channel,) = (c for c in generated["channels"].values() if c["address"] == address)
        for reference in channel["messages"].values():
            message = messages[reference["$ref"].removeprefix("#/components/messages/")]
            message["headers"] = HEADERS
            message["bindings"] = {
                "kafka": {"key": key_schema(default), "bindingVersion": KAFKA_BINDING_VERSION}
            }
    # FastStream lists a broker's publishers in the order of a WeakSet: sorted, the text is stable.
    components = generated["components"]
    for section, name in (
        (generated, "channels"),
        (generated, "operations"),
        (components, "messages"),
        (components, "schemas"),
    ):
        section[name] = dict(sorted(section[name].items()))
    return generated


def committed_document() -> str:
    """The text of ``schemas/asyncapi.yaml``: the document for the default settings, whatever the environment."""
    topics, kafka = TopicSettings(), KafkaSettings()
    return render_yaml(document(declare(make_broker(kafka), topics, kafka).specification, topics))


def _addresses(topics: TopicSettings) -> dict[str, str]:
    """Each default topic name and the name the settings give it."""
    return {default: getattr(topics, field) for default, field in _FIELDS.items()}


def _renamed_by() -> dict[str, str]:
    return {default: env_name(f"topics.{field}") for default, field in _FIELDS.items()}


def _server_description() -> str:
    kafka = KafkaSettings.model_fields
    protocols = ", ".join(literal_values(kafka["security_protocol"].annotation))
    mechanisms = ", ".join(literal_values(kafka["sasl_mechanism"].annotation))
    return prose(
        f"The Kafka cluster the worker pool consumes from and publishes to; "
        f"`{env_name('kafka.bootstrap_servers')}` names its bootstrap servers (`host:port`, "
        f"comma-separated). Security protocols: {protocols}; SASL mechanisms: {mechanisms} "
        f"(`{env_name('kafka.security_protocol')}` and the other `{env_name('kafka.')}*` settings)."
    )
