"""A poison turn cannot stall its partition: through the real broker, one turn that keeps failing
is dead-lettered after bounded tries, and the conversations behind it on its partition go on."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import redis.asyncio
from aiokafka import AIOKafkaProducer

from compaction_worker.contracts.events import DeadLetter, TurnEvent
from compaction_worker.conversation import decide as plan
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.state.store import Store
from compaction_worker.testing import turn_bytes
from tests.integration.helpers import committed_records, group_offsets, poll_until, read_topic
from tests.orchestration import assistant, make_settings, user

pytestmark = pytest.mark.integration

TURNS = 5
POISON = ("poison", 3)
"""The conversation and seq of the turn whose handling always fails (its last)."""


async def test_a_poison_turn_is_dead_lettered_and_its_partition_goes_on(
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    make_topics: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=1)
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        kafka={"consumers": 1},
        retry={"base_seconds": 0.05, "cap_seconds": 0.2, "turn_attempts": 3},
    )
    await ensure_topics(settings)
    tries = 0
    real = plan.plan_append

    def failing(event: TurnEvent, *args: Any, **kwargs: Any) -> Any:
        nonlocal tries
        if (event.conversation_id, event.turn_seq) == POISON:
            tries += 1
            raise ZeroDivisionError("a bug this one turn triggers")
        return real(event, *args, **kwargs)

    monkeypatch.setattr(plan, "plan_append", failing)
    conversations = {"a": TURNS, "poison": POISON[1], "b": TURNS}
    records = []
    for seq in range(1, TURNS + 1):  # interleaved on the one partition: a, poison, b, a, ...
        for cid, last in conversations.items():
            if seq <= last:
                message = user(f"{cid} {seq}") if seq % 2 else assistant(f"{cid} {seq}")
                records.append((cid, seq, turn_bytes(cid, seq, [message])))
    store = Store(redis_client, settings.redis.key_prefix, None)

    worker = build_worker(settings)
    async with worker.running():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for cid, _, payload in records:
                await producer.send_and_wait(settings.topics.turns, payload, key=cid.encode())
        finally:
            await producer.stop()

        async def stored() -> dict[str, int]:
            return {cid: (await store.meta(cid)).last_seq for cid in conversations}

        async def all_stored() -> bool:
            return await stored() == {"a": TURNS, "poison": POISON[1] - 1, "b": TURNS}

        await poll_until(all_stored, 60, "the other conversations stored", detail=stored)
        async with group_offsets(settings) as offsets:

            async def committed() -> bool:
                return await committed_records(offsets) == len(records)

            await poll_until(committed, 30, "every offset committed, the poison turn's too")

    assert tries == 3
    letters = [DeadLetter.model_validate_json(r) for r in await read_topic(settings, settings.topics.dlq)]
    (letter,) = letters
    assert (letter.reason.value, letter.conversation_id) == ("processing_failed", "poison")
    assert "ZeroDivisionError: a bug this one turn triggers" in letter.detail
    poison_payload = next(p for cid, seq, p in records if (cid, seq) == POISON)
    assert base64.b64decode(letter.original_b64) == poison_payload
