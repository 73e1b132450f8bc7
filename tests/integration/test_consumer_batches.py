"""The turns consumer's batches against the real broker and Redis: an outage in the middle of one.

A backlog is published before the worker starts, so every fetch is a full batch of many
conversations handled concurrently; Redis stops from inside the worker's own turn callback,
so the outage is certain to land mid-batch, with other turns of that batch in flight.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

import pytest

from compaction_worker.client.client import Client
from compaction_worker.local.embedded import EmbeddedRedis
from compaction_worker.runtime.turns import TurnOutcome
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import turn_bytes
from tests.orchestration import make_settings, user

from .helpers import (
    committed_records,
    group_offsets,
    poll_until,
    publish_many,
    read_topic,
)

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

CONVERSATIONS, TURNS = 24, 30
STOP_AFTER = 150
"""Turns stored before Redis stops (of CONVERSATIONS * TURNS)."""


async def test_a_redis_outage_mid_batch_redelivers_and_loses_nothing(
    kafka_bootstrap: str,
    own_durable_redis: EmbeddedRedis,
    make_topics: MakeTopics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Turns of the batch in hand that met the outage come back: each stored once, in order, all committed."""
    caplog.set_level(logging.WARNING, logger="compaction_worker.runtime.consumer")
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=4)
    settings = make_settings(
        kafka_bootstrap,
        own_durable_redis.url,
        topics,
        retry={"base_seconds": 0.2, "cap_seconds": 0.2},
        kafka={"batch_concurrency": 8},
    )
    run = uuid.uuid4().hex[:6]
    cids = [f"batch-{run}-{i}" for i in range(CONVERSATIONS)]
    backlog = [
        (c.encode(), turn_bytes(c, seq, [user(f"turn {seq} of {c}")]))
        for seq in range(1, TURNS + 1)
        for c in cids
    ]
    stored = 0

    def on_turn(_outcome: TurnOutcome) -> None:
        nonlocal stored
        stored += 1
        if stored == STOP_AFTER:
            own_durable_redis.stop()  # synchronously, mid-batch: the batch's other turns are in flight

    def refused() -> int:
        return sum("infrastructure error on a turn" in r.getMessage() for r in caplog.records)

    async def stored_seqs(client: Client) -> list[int]:
        return [(await client.meta(c)).last_seq for c in cids]

    async def all_stored(client: Client) -> bool:
        return all(s == TURNS for s in await stored_seqs(client))

    async def committed() -> bool:
        async with group_offsets(settings) as reader:
            return await committed_records(reader) == len(backlog)

    worker = build_worker(settings, on_turn=on_turn)
    async with Client.connect(settings) as client:
        await publish_many(client, backlog)
        async with worker.running():
            await poll_until(
                lambda: not own_durable_redis.running and refused() >= 1, 60, "the outage met mid-batch"
            )
            assert stored < len(backlog), "the backlog was stored before the outage"
            await asyncio.to_thread(own_durable_redis.start)
            await poll_until(
                lambda: all_stored(client), 60, "every turn stored", detail=lambda: stored_seqs(client)
            )
            await poll_until(committed, 30, "every offset committed")
        for c in cids:
            transcript = await client.transcript(c)
            assert [r["seq"] for r in transcript] == list(range(1, TURNS + 1)), c
            assert [r["m"]["content"] for r in transcript] == [
                f"turn {s} of {c}" for s in range(1, TURNS + 1)
            ]
    assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []
