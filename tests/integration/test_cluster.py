"""A Redis Cluster primary restarts mid-run: turns and compactions keep going, nothing is lost (cluster only)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio.cluster import RedisCluster

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import Outcome
from compaction_worker.local.cluster import EmbeddedRedisCluster
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import fake_summarizer, make_settings

from .helpers import compaction_events, coverage_problems, read_topic, settle_store

pytestmark = pytest.mark.integration

CONVERSATIONS = 6
TURNS = 50
WINDOW = 3000


async def test_a_primary_restart_loses_nothing(
    kafka_bootstrap: str,
    redis_cluster: EmbeddedRedisCluster,
    make_topics: object,
    fake_llm: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Half the turns, a primary down for a second (its slots unreachable), the rest: all stored once, compacted."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=4)  # type: ignore[operator]
    settings = make_settings(
        kafka_bootstrap,
        redis_cluster.url,
        topics,
        summarizer=fake_summarizer(fake_llm),
        worker={"sweep_interval_seconds": 0.2},
        retry={"base_seconds": 0.2, "cap_seconds": 0.2},
    )
    caplog.set_level(logging.WARNING)
    await ensure_topics(settings)
    streams = {
        f"conv-{i}": synthetic_turns(f"conv-{i}", TURNS, context_window=WINDOW, seed=i)
        for i in range(CONVERSATIONS)
    }
    # The restarted primary owns conv-0 (and some index buckets).
    async with Client.connect(settings, kafka=False) as probe:
        redis = probe.store.redis
        assert isinstance(redis, RedisCluster)
        await redis.initialize()  # the slot map
        owner = redis.get_node_from_key(probe.store.keys("conv-0").meta)
        assert owner is not None
        victim = redis_cluster.ports.index(int(owner.port))

    async def publish(client: Client, seqs: range) -> None:
        for seq in seqs:
            for events in streams.values():
                await client.publish_raw(
                    events[seq].model_dump_json(exclude_none=True).encode(),
                    events[seq].conversation_id.encode(),
                )

    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        await publish(client, range(TURNS // 2))
        # The primary goes down in the middle of the turns, and the rest arrive while it is down: the
        # worker meets the outage (a turn of conv-0 comes back to be redelivered), then it returns.
        await asyncio.to_thread(redis_cluster.stop_primary, victim)
        await publish(client, range(TURNS // 2, TURNS))
        for _ in range(300):  # up to 30 s for the worker to reach a turn of the stopped primary
            if redelivered(caplog):
                break
            await asyncio.sleep(0.1)
        await asyncio.to_thread(redis_cluster.start_primary, victim)
        await settle_store(client, dict.fromkeys(streams, TURNS), CONVERSATIONS * TURNS, within=180)

        _, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        for cid, events in streams.items():
            compacted = [c for c in completed[cid] if c.outcome is Outcome.COMPACTED]
            assert compacted, f"{cid}: {[(c.outcome, c.error) for c in completed[cid]]}"
            transcript = await client.transcript(cid)
            expected = [m.to_dict() for e in events for m in e.messages]
            assert [r["m"] for r in transcript] == expected  # every turn once, in order
            snapshot = await client.snapshot(cid)
            # At least once: an event the outbox relayed after the outage may come twice; none is missing.
            assert {c.version for c in compacted} == set(range(1, snapshot.meta.version + 1))
            assert coverage_problems(snapshot.history, len(expected)) == []
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []
    # The outage was felt: turns came back (the consumer rewound) and were stored on the second try.
    assert redelivered(caplog), "the restart went unnoticed"


def redelivered(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the worker logged a turn it will see again (a batch it could not store)."""
    return any("will be redelivered" in r.getMessage() for r in caplog.records)
