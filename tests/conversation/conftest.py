"""The state tests' store: the tests' Redis under the prefix ``t``, with a one-hour retention."""

from __future__ import annotations

import pytest
import redis.asyncio

from compaction_worker.state.store import Store


@pytest.fixture
def store(redis_client: redis.asyncio.Redis) -> Store:
    return Store(redis_client, "t", retention_seconds=3600)
