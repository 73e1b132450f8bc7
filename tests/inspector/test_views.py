"""The inspector's views over real Redis: a listed conversation's figures."""

from __future__ import annotations

import uuid

import pytest

from compaction_worker.client.client import Client
from compaction_worker.inspector import views
from compaction_worker.state.connection import RedisClient
from compaction_worker.testing import turn_bytes
from tests.orchestration import Published, make_parts, make_settings, user

pytestmark = pytest.mark.integration


async def test_a_listed_conversation_is_measured_under_its_profile(redis_client: RedisClient) -> None:
    """A row's figures are those of the conversation's own settings profile, as its page's are."""
    settings = make_settings(
        profiles={"tight": {"budget": {"trigger_fraction": 0.3, "target_fraction": 0.15}}}
    )
    parts = make_parts(redis_client, settings, Published())
    cid = f"profiled-{uuid.uuid4().hex}"
    await parts.turns.handle(turn_bytes(cid, 1, [user("hi")], profile="tight"), cid.encode())
    client = Client(settings, parts.store, None)

    (row,) = (await views.listing(client, settings, cid)).recent

    assert row.meta.profile == "tight"
    assert row.stats == await client.context_stats(cid)
    unprofiled = make_settings()
    assert row.stats.threshold < unprofiled.budget.trigger_fraction * row.stats.window
