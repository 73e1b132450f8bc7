"""Helpers for tests that run whole workers against the real broker and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, CompactionStarted
from compaction_worker.contracts.history import EffectiveHistory, render
from compaction_worker.conversation.keys import bucket_keys, jobs_index_key
from compaction_worker.runtime.worker import Worker
from compaction_worker.settings import Settings
from compaction_worker.strategies import provider_problems


async def settle(workers: Sequence[Worker], expected_deliveries: int, within: float = 120) -> None:
    """Wait until the workers handled every delivery and no compaction is pending or running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        handled = sum(w.handled for w in workers)
        busy = any(w.pool.tasks for w in workers)
        pending = await workers[0].pool.jobs.pending_count()
        if handled >= expected_deliveries and not busy and pending == 0:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"not settled after {within}s: {[repr(w) for w in workers]}")


async def poll_until(
    check: Callable[[], Awaitable[bool] | bool],
    within: float,
    what: str,
    interval: float = 0.1,
    detail: Callable[[], Awaitable[object]] | None = None,
) -> float:
    """Poll ``check`` until it is true; returns the seconds it took, fails after ``within``.

    ``detail``, when given, is awaited for the failure message (what was seen instead).
    """
    start = time.monotonic()
    while True:
        result = check()
        if await result if inspect.isawaitable(result) else result:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"not {what} after {within}s" + (f"; {await detail()}" if detail else ""))
        await asyncio.sleep(interval)


async def publish_many(client: Client, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Publish ``(key, payload)`` records in this order, pipelined (per-partition order is kept)."""
    producer = client.producer
    assert producer is not None, "the client was opened without Kafka"
    topic = client.settings.topics.turns
    sent = [await producer.send(topic, payload, key=key) for key, payload in records]
    await asyncio.gather(*sent)


@contextlib.asynccontextmanager
async def group_offsets(settings: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer in the workers' group that only reads its offsets: assigned every turns
    partition by hand, it never joins the group and never commits."""
    topic = settings.topics.turns
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=settings.kafka.group_id,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        await consumer.topics()  # metadata, so the partitions are known
        consumer.assign(
            [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        )
        yield consumer
    finally:
        await consumer.stop()


async def committed_records(consumer: AIOKafkaConsumer) -> int:
    """How many records of its assigned partitions the consumer's group has committed, in all.

    Counted from the committed offsets, not as lag against end offsets: the embedded broker
    reports a partition's end offset as its last batch's base offset plus one, short of the
    truth when producers batch.
    """
    return sum([await consumer.committed(tp) or 0 for tp in sorted(consumer.assignment())])


async def settle_store(
    client: Client,
    last_seqs: Mapping[str, int],
    deliveries: int,
    within: float = 120,
    quiet: float = 1.0,
    *,
    jobs_done: bool = True,
) -> None:
    """Wait until worker processes are done: for workers this test cannot look inside.

    Done means: every conversation has its last turn stored and nothing held behind a gap,
    the workers' consumer group has committed all ``deliveries`` records published to the
    (fresh) turns topic, so every delivery was handled, and (unless ``jobs_done`` is
    false) the job index is empty: no compaction pending or running, since a running one
    keeps its leased entry. All of it in two checks ``quiet`` seconds apart.
    """
    redis = client.store.redis
    async with group_offsets(client.settings) as offsets:
        jobs = bucket_keys(jobs_index_key(client.store.prefix), client.settings.redis.index_shards)
        problems: list[str] = []

        async def done() -> bool:
            problems.clear()
            async with redis.pipeline(transaction=False) as pipe:
                for cid in last_seqs:
                    keys = client.store.keys(cid)
                    pipe.hget(keys.meta, "last_seq")
                    pipe.hlen(keys.pending)
                for bucket in jobs:
                    pipe.zcard(bucket)
                replies = await pipe.execute()
            for i, (cid, expected) in enumerate(last_seqs.items()):
                last, held = int(replies[2 * i] or 0), replies[2 * i + 1]
                if last != expected or held:
                    problems.append(f"{cid}: last_seq {last} of {expected}, {held} held")
            if jobs_done and (pending := sum(replies[2 * len(last_seqs) :])):
                problems.append(f"{pending} jobs in the index")
            committed = await committed_records(offsets)
            if committed != deliveries:
                problems.append(f"{committed} of {deliveries} deliveries committed")
            return not problems

        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if await done():
                await asyncio.sleep(quiet)
                if await done():
                    return
            await asyncio.sleep(0.25)
        # What is left in the job index, with when each entry is due and its conversation's
        # failure count: the clue to why a compaction did not run.
        now_ms = time.time() * 1000
        left = []
        entries = [entry for key in jobs for entry in await redis.zrange(key, 0, 9, withscores=True)]
        for entry in entries[:10]:
            cid, score = entry[0], float(entry[1])
            name = cid.decode() if isinstance(cid, bytes) else str(cid)
            meta = await redis.hmget(client.store.keys(name).meta, "failures", "retry_after")
            job = await redis.hget(client.store.keys(name).meta, "job_trigger")
            left.append(
                f"{name}: due in {(score - now_ms) / 1000:.1f}s, failures/retry_after {meta}, job {job!r}"
            )
        raise AssertionError(f"not settled after {within}s: {problems[:10]}; job index: {left}")


async def read_topic(settings: Settings, topic: str, idle: float = 2.0) -> list[bytes]:
    """Every record of a topic, from the beginning, until it has been quiet for ``idle`` seconds."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=f"reader-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < idle:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                values.extend(r.value for r in records)
                quiet_since = time.monotonic()
    finally:
        await consumer.stop()
    return values


async def conversation_events(settings: Settings, topic: str, cid: str, count: int) -> list[dict[str, Any]]:
    """The conversation's events on ``topic`` (as JSON), once there are ``count`` of them, in order."""
    for _ in range(60):
        found = [
            e
            for e in map(json.loads, await read_topic(settings, topic, idle=0.5))
            if e["conversation_id"] == cid
        ]
        if len(found) >= count:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"{cid}: {count} events on {topic} never arrived")


def compaction_events(
    started_raw: Sequence[bytes], completed_raw: Sequence[bytes]
) -> tuple[dict[str, list[CompactionStarted]], dict[str, list[CompactionCompleted]]]:
    """Started and completed events grouped by conversation."""
    started: dict[str, list[CompactionStarted]] = defaultdict(list)
    completed: dict[str, list[CompactionCompleted]] = defaultdict(list)
    for raw in started_raw:
        event = CompactionStarted.model_validate_json(raw)
        started[event.conversation_id].append(event)
    for raw in completed_raw:
        done = CompactionCompleted.model_validate_json(raw)
        completed[done.conversation_id].append(done)
    return started, completed


def coverage_problems(history: EffectiveHistory, message_count: int) -> list[str]:
    """Ways the effective history fails to account for every message exactly once (docs/design.md, invariant 1)."""
    seen: list[int] = []
    for chunk in history.chunks:
        seen.extend(n for n in range(chunk.first_n, chunk.last_n + 1) if chunk.covers(n))
    # Synthetic entries (made up by repair, ordinal 0) stand for no transcript message.
    seen.extend(e.n for e in history.entries if not e.synthetic)
    problems = []
    if sorted(seen) != list(range(1, message_count + 1)):
        missing = sorted(set(range(1, message_count + 1)) - set(seen))
        doubled = sorted(n for n in set(seen) if seen.count(n) > 1)
        problems.append(f"missing {missing[:10]}, covered twice {doubled[:10]}")
    problems.extend(provider_problems(render(history)))
    return problems
