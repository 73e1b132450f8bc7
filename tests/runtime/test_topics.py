"""Topic creation against the real broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from compaction_worker.runtime.topics import create_topics

pytestmark = pytest.mark.integration


async def test_create_topics_is_idempotent(kafka_bootstrap: str) -> None:
    """Existing topics are skipped; only the new ones are created and returned."""
    a, b = (f"idem-{n}.{uuid.uuid4().hex[:8]}" for n in "ab")

    first = await create_topics(kafka_bootstrap, [a], partitions=3)
    again = await create_topics(kafka_bootstrap, [a, a], partitions=3)
    more = await create_topics(kafka_bootstrap, [a, b], partitions=3)

    assert (first, again, more) == ([a], [], [b])
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([a])
    finally:
        await admin.close()
    assert len(described[0]["partitions"]) == 3
