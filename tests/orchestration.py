"""What the tests share: their settings, an in-memory publisher, events, the wired parts."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Publish
from compaction_worker.runtime.compactor import Compactor, Summarizers
from compaction_worker.runtime.components import Components, build_components
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.runtime.pool import run_job
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import Worker, build_worker
from compaction_worker.settings import RedisSettings, Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.jobs import JobQueue
from compaction_worker.strategies import summary_overhead
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import FakeLLMServer, turn_bytes


class Published:
    """An in-memory publisher: (topic, payload, key) triples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, bytes | None]] = []

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        self.events.append((topic, payload, key))

    def on(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(p) for t, p, _ in self.events if t == topic]


Parts = Components
"""The ``parts`` fixture: the production wiring (``build_components``) over the test's Redis."""


def extractive(_model: str, counter: TokenCounter) -> list[Summarizer]:
    """The summarizers of the tests' parts: the deterministic extractive one only."""
    return [ExtractiveSummarizer(counter.text)]


def connect(redis_url: str) -> RedisClient:
    """A new client of the tests' Redis (a cluster client for a ``redis+cluster://`` URL)."""
    return connect_redis(RedisSettings(url=redis_url))


async def all_keys(redis: RedisClient, pattern: str = "*") -> list[bytes | str]:
    """KEYS on the server, or on every primary of a cluster."""
    if isinstance(redis, RedisCluster):
        return list(await redis.keys(pattern, target_nodes=RedisCluster.PRIMARIES))
    return list(await redis.keys(pattern))


def make_parts(
    redis_client: RedisClient,
    settings: Settings,
    published: Publish,
    summarizers: Summarizers = extractive,
) -> Parts:
    """The wired components over ``redis_client``, publishing to ``published``; extractive summaries."""
    return build_components(settings, redis_client, published, summarizers=summarizers)


def compactor_with(parts: Parts, published: Publish, summarizers: Summarizers) -> Compactor:
    """A compactor wired as ``parts``' is (same Redis, same settings) with other summarizers."""
    return make_parts(parts.store.redis, parts.settings, published, summarizers).compactor


def fake_summarizer(server: FakeLLMServer) -> dict[str, str]:
    """The summarizer section that points a worker at a test's fake LLM server."""
    return {"model": "openai/fake-summarizer", "api_base": server.url, "api_key": "fake-key-0123456789"}


def fresh_topics() -> list[str]:
    """A worker's four topics (turns, started, completed, dlq), named for this test alone."""
    return [f"{base}.{uuid.uuid4().hex[:12]}" for base in ("turn", "started", "completed", "dlq")]


def make_settings(
    kafka_bootstrap: str | None = None,
    redis_url: str | None = None,
    topics: Sequence[str] | None = None,
    /,
    **sections: Mapping[str, Any],
) -> Settings:
    """A test's settings: ``sections`` merged key by key over those of where the test runs.

    In process (no ``kafka_bootstrap``; the ``settings`` fixture): key prefix ``t``, no
    expiry, a 16 KiB event limit. A worker on the real broker: on ``topics`` (turns,
    started, completed, dlq), ``redis_url`` and a consumer group and key prefix of its own,
    two consumers, short session timeouts, an hour's expiry and a fast sweeper.
    """
    data: dict[str, Any]
    if kafka_bootstrap is None:
        data = {"redis": {"key_prefix": "t", "retention_seconds": None}, "kafka": {"max_event_bytes": 16384}}
    else:
        assert topics is not None, "a worker on the real broker needs its topics"
        turns, started, completed, dlq = topics
        suffix = uuid.uuid4().hex[:8]
        data = {
            "kafka": {
                "bootstrap_servers": kafka_bootstrap,
                "enable_idempotence": False,
                "group_id": f"test-{suffix}",
                "consumers": 2,
                "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000,
            },
            "redis": {"url": redis_url, "key_prefix": f"t{suffix}", "retention_seconds": 3600},
            "topics": {
                "turns": turns,
                "started": started,
                "completed": completed,
                "proposed": f"proposed.{suffix}",
                "dlq": dlq,
            },
            "worker": {"sweep_interval_seconds": 0.2},
        }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return Settings(**data)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def conversation(turns: int) -> list[bytes]:
    out = []
    for seq in range(1, turns + 1):
        msg = (
            user(f"question {seq}: " + "detail " * 60)
            if seq % 2
            else assistant(f"answer {seq}: " + "because " * 60)
        )
        out.append(
            turn_bytes(
                "c", seq, [msg], context_window=2048, **({"system_prompt": "Be brief."} if seq == 1 else {})
            )
        )
    return out


def rules_conversation(system_words: int, turns: int) -> list[bytes]:
    """Exchanges after a system prompt of ``system_words`` words that may never be compacted, on a
    2K window (available 1,536 tokens, threshold 1,228, target 768)."""
    prompt = {"system_prompt": "rule " * system_words}
    return [
        turn_bytes(
            "c",
            seq,
            [user(f"question {seq}: " + "detail " * 60), assistant(f"answer {seq}: " + "because " * 60)],
            context_window=2048,
            **(prompt if seq == 1 else {}),
        )
        for seq in range(1, turns + 1)
    ]


async def compact_now(jobs: JobQueue, compactor: Compactor, cid: str = "c") -> CompactionCompleted:
    """Claim the conversation's job (its lock) and run it, as the pool does; it must run."""
    completed = await run_job(jobs, compactor, cid)
    assert completed is not None
    return completed


def overhead() -> int:
    return summary_overhead(counter_for("gpt-4o-mini", Settings().budget))


@contextlib.asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[tuple[Worker, Client]]:
    """A worker on ``settings`` (its topics created first) and a client of it, for the block: the
    tests' one way to run a whole worker against the real broker and Redis."""
    await ensure_topics(settings)
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        yield worker, client
