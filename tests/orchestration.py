"""What the turn, compaction and rewind tests share: an in-memory publisher, events, fixtures' parts."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import (
    CompactionCompleted,
)
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.publisher import Publisher
from compaction_worker.runtime.turns import TurnHandler
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Locks
from compaction_worker.state.store import Store
from compaction_worker.strategies import summary_overhead
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import turn_payload


class Published:
    """An in-memory publisher: (topic, payload, key) triples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, bytes | None]] = []

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        self.events.append((topic, payload, key))

    def on(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(p) for t, p, _ in self.events if t == topic]


def make_parts(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Publisher
) -> tuple[TurnHandler, Compactor, Store, JobQueue]:
    """A turn handler and a compactor over one store, with the extractive summarizer."""
    store = Store(redis_client, "t", None)
    jobs = JobQueue(store, 60)
    turns = TurnHandler(settings, store, jobs, published)
    compactor = Compactor(
        settings,
        store,
        Locks(redis_client, 30),
        jobs,
        published,
        summarizers=lambda _m, c: [ExtractiveSummarizer(c.text)],
    )
    return turns, compactor, store, jobs


def test_settings() -> Settings:
    """Settings with a small event-size limit and a key prefix of its own."""
    return Settings(redis={"key_prefix": "t"}, kafka={"max_event_bytes": 16384})


def raw(cid: str, seq: int, *messages: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps(turn_payload(cid, seq, list(messages), **fields)).encode()


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
            raw("c", seq, msg, context_window=2048, **({"system_prompt": "Be brief."} if seq == 1 else {}))
        )
    return out


async def compact_now(jobs: JobQueue, compactor: Compactor, cid: str = "c") -> CompactionCompleted:
    claim = await jobs.claim(cid)
    assert claim is not None
    completed = await compactor.run(claim)
    assert completed is not None
    return completed


def overhead() -> int:
    return summary_overhead(counter_for("gpt-4o-mini", Settings().budget))
