"""Helpers for tests that run whole workers against the real broker and Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer

from compaction_worker.events import CompactionCompleted, CompactionStarted
from compaction_worker.history import EffectiveHistory, render
from compaction_worker.settings import Settings
from compaction_worker.strategies import provider_problems
from compaction_worker.worker import Worker


def worker_settings(
    kafka_bootstrap: str, redis_url: str, topics: Sequence[str], **sections: Mapping[str, Any]
) -> Settings:
    """Settings for a test worker on its own topics, group and key prefix."""
    turns, started, completed, dlq = topics
    suffix = uuid.uuid4().hex[:8]
    data: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": kafka_bootstrap,
            "enable_idempotence": False,
            "group_id": f"test-{suffix}",
            "consumers": 2,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
        },
        "redis": {"url": redis_url, "key_prefix": f"t{suffix}", "retention_seconds": 3600},
        "topics": {"turns": turns, "started": started, "completed": completed, "dlq": dlq},
        "worker": {"sweep_interval_seconds": 0.2},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return Settings(**data)


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
    """Ways the effective history fails to account for every message exactly once (invariant 1)."""
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
