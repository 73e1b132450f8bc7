"""One trace from the runtime's publish to compaction.completed, on the real broker and Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import TurnEvent
from compaction_worker.observability import tracing
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_event
from tests.observability.memory import Memory, memory
from tests.orchestration import make_settings

pytestmark = pytest.mark.integration

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
RUNTIME_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{RUNTIME_SPAN:016x}-01"


@pytest.fixture
def telemetry() -> Iterator[Memory]:
    with memory().recording() as installed:
        yield installed


async def first_record_headers(settings: Settings, topic: str, within: float = 60) -> dict[str, bytes]:
    """The headers of a topic's first record (waiting for it)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=f"reader-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=300)).values():
                for record in records:
                    return {k: bytes(v) for k, v in record.headers}
    finally:
        await consumer.stop()
    raise AssertionError(f"nothing on {topic} after {within}s")


async def test_a_traceparent_on_a_turn_reaches_compaction_completed(
    kafka_bootstrap: str, redis_url: str, make_topics: object, telemetry: Memory
) -> None:
    topics = await make_topics("turn", "started", "completed", "dlq")  # type: ignore[operator]
    settings = make_settings(kafka_bootstrap, redis_url, topics)
    await ensure_topics(settings)
    worker = build_worker(settings)

    def turn(seq: int, **fields: Any) -> TurnEvent:
        return turn_event(
            "conv", seq, [{"role": "user", "content": f"message {seq}: " + "words " * 80}], **fields
        )

    async with worker.running(), Client.connect(settings) as client:
        for seq in range(1, 6):
            await client.publish_turn(turn(seq))  # no trace: nothing current
        # The runtime's own span (remote here): publish_turn injects it into the turn's headers.
        runtime = tracing.extract_context({"traceparent": TRACEPARENT})
        with tracing.span("runtime turn", context=runtime):
            await client.publish_turn(turn(6, compaction={"mode": "force"}))
        started = await first_record_headers(settings, settings.topics.started)
        completed = await first_record_headers(settings, settings.topics.completed)

    for headers in (started, completed):
        assert headers["traceparent"].decode().split("-")[1] == f"{TRACE_ID:032x}"
    spans = telemetry.finished()
    (turn_span,) = [
        s
        for s in telemetry.named(f"{settings.topics.turns} process")
        if s.parent is not None and s.parent.trace_id == TRACE_ID
    ]
    by_id = {s.context.span_id: s for s in spans}
    assert turn_span.parent is not None
    assert by_id[turn_span.parent.span_id].name == "runtime turn"
    runs = [s for s in telemetry.named(tracing.RUN_SPAN) if s.context.trace_id == TRACE_ID]
    # A look that found the job gone or its lock busy is in the trace too (its lock wait), as skipped.
    (run,) = [s for s in runs if (s.attributes or {}).get("compaction.outcome") != "skipped"]
    # The run descends from the turn's span (the request was stored with its context).
    ancestors, current = [], run
    while current.parent is not None and current.parent.span_id in by_id:
        current = by_id[current.parent.span_id]
        ancestors.append(current.name)
    assert f"{settings.topics.turns} process" in ancestors, ancestors
    completed_parent = completed["traceparent"].decode().split("-")[2]
    assert completed_parent == f"{run.context.span_id:016x}"
    # The five turns published outside any span have traces of their own.
    others = [s for s in telemetry.named(f"{settings.topics.turns} process") if s is not turn_span]
    assert len(others) == 5
    assert all(s.context.trace_id != TRACE_ID for s in others)
