"""The inspector's views over real Redis: a listed conversation's figures."""

from __future__ import annotations

import uuid

import httpx
import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import Trigger
from compaction_worker.inspector import views
from compaction_worker.inspector.app import build_app
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.lock import Lease
from compaction_worker.state.proposals import Proposals
from compaction_worker.testing import turn_bytes
from tests.conversation.test_status import proposal_from
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


async def test_the_pending_job_and_a_waiting_proposal_are_shown(redis_client: RedisClient) -> None:
    """The list and the page read the conversation's status: its pending job (pending, then
    running under the lock) and a waiting proposal."""
    settings = make_settings()
    parts = make_parts(redis_client, settings, Published())
    cid = f"pending-{uuid.uuid4().hex}"
    await parts.turns.handle(turn_bytes(cid, 1, [user("hi")]), cid.encode())
    await parts.jobs.schedule(cid, Trigger.MANUAL)
    client = Client(settings, parts.store, None)
    app = build_app(settings, client)
    path = f"/c/{cid}"

    (row,) = (await views.listing(client, settings, cid)).recent
    assert row.status.job is not None
    assert row.status.job.trigger is Trigger.MANUAL
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i") as http:
        assert "<b>compaction pending</b> (manual)" in (await http.get(path)).text
        assert "manual pending" in (await http.get("/")).text
        lease = await parts.locks.acquire(cid, parts.store.keys(cid))
        assert isinstance(lease, Lease)
        assert "<b>compaction running</b> (manual)" in (await http.get(path)).text

        snapshot = await parts.store.snapshot(cid)
        await Proposals(parts.store).put(cid, proposal_from(snapshot.meta, snapshot.entry_count))
        page = (await http.get(path)).text
        assert '<b id="proposal">proposal waits</b>' in page
        assert "stale" not in page
        await parts.turns.handle(turn_bytes(cid, 2, [user("more")]), cid.encode())
        assert "stale: 1 turn since" in (await http.get(path)).text
        assert "proposal waits" in (await http.get("/")).text
