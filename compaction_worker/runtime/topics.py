"""Topic creation: the service's four topics, or any others (tests, the embedded broker)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.settings import Settings


async def create_topics(
    bootstrap_servers: str,
    names: Sequence[str],
    partitions: int,
    replication_factor: int = 1,
    **client_kwargs: Any,
) -> list[str]:
    """Create the topics that do not exist yet and return the names of those it created.

    Existing topics are left as they are (whatever their partition count).
    ``client_kwargs`` go to aiokafka's admin client (``security_protocol``,
    ``sasl_mechanism``, ``ssl_context``, ...).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in dict.fromkeys(names) if name not in existing]
        if not missing:
            return []
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor) for name in missing]
        )
    finally:
        await admin.close()
    created: list[str] = []
    for topic, code, *rest in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != TopicAlreadyExistsError.errno:  # another process won the race: fine
            message = rest[0] if rest else None
            raise for_code(code)(f"creating topic {topic!r}: {message or 'error code ' + str(code)}")
    return created


async def ensure_topics(settings: Settings) -> list[str]:
    """Create the worker's topics if missing, with the configured partition count."""
    topics = settings.topics
    assert settings.kafka.bootstrap_servers
    return await create_topics(
        settings.kafka.bootstrap_servers,
        [topics.turns, topics.started, topics.completed, topics.proposed, topics.dlq],
        topics.partitions,
        topics.replication_factor,
        **kafka_client_args(settings.kafka),
    )
