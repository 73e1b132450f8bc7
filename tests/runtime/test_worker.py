"""The worker: the compaction pool's graceful stop, and the turns consumer's acknowledgements.

The pool tests run against the real Redis with a summarizer that waits, so the test decides
when the "LLM call" ends. The acknowledgement tests hand the worker's turn handling a batch
(dead letters go through FastStream's in-memory test broker).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import subprocess
import sys
import time

import pytest
import redis.asyncio
import redis.exceptions
from aiokafka import ConsumerRecord, TopicPartition
from faststream.kafka import TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from compaction_worker import _litellm
from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import DeadLetter, Outcome
from compaction_worker.local.embedded import free_port
from compaction_worker.runtime.consumer import BatchResult, Record, handle_batch
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.runtime.turns import TurnOutcome, TurnStatus
from compaction_worker.runtime.worker import YOUNG_GC_THRESHOLD, Worker, build_worker, tune_gc
from compaction_worker.settings import Settings
from compaction_worker.summaries.contract import CountTokens, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, all_keys, compactor_with, conversation, make_settings, user

COUNT = counter_for("gpt-4o-mini", Settings().budget).text  # the model of orchestration's turns


class Slow(ExtractiveSummarizer):
    """The extractive summary, given only once ``release`` is set; ``asked`` is set on entry."""

    def __init__(self, count_tokens: CountTokens = COUNT) -> None:
        super().__init__(count_tokens)
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.asked.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await super().summarize(request)


async def _over_threshold(parts: Parts) -> None:
    for event in conversation(24):
        await parts.turns.handle(event, b"c")
    assert await parts.jobs.pending_count() == 1


def _pool(parts: Parts, published: Published, summarizer: ExtractiveSummarizer) -> CompactionPool:
    compactor = compactor_with(parts, published, lambda _m, _c: [summarizer])
    return CompactionPool(compactor, parts.jobs, size=2, sweep_interval=0.05)


async def test_stop_lets_a_compaction_finish_within_the_grace(parts: Parts, published: Published) -> None:
    """A compaction that ends inside the grace period commits; nothing is handed back."""
    await _over_threshold(parts)
    summarizer = Slow()
    pool = _pool(parts, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)

    stopping = asyncio.create_task(pool.stop(grace=10))
    await asyncio.sleep(0.2)
    assert not stopping.done(), "stop() did not wait for the running compaction"
    summarizer.release.set()
    await asyncio.wait_for(stopping, 10)

    assert (pool.completed, pool.failed, summarizer.cancelled) == (1, 0, False)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await parts.store.meta("c")).version == 1
    assert await parts.jobs.pending_count() == 0


async def test_stop_hands_back_a_compaction_that_outlasts_the_grace(
    parts: Parts, published: Published
) -> None:
    """Past the grace period the compaction is cancelled, its lock released and its job due
    now, so another worker takes it over at once instead of after the lease or the lock TTL."""
    await _over_threshold(parts)
    store, jobs = parts.store, parts.jobs
    keys = store.keys("c")
    summarizer = Slow()
    pool = _pool(parts, published, summarizer)
    pool.start()
    await asyncio.wait_for(summarizer.asked.wait(), 10)
    assert await store.redis.exists(keys.lock)

    began = time.monotonic()
    await pool.stop(grace=0.3)
    took = time.monotonic() - began
    assert summarizer.cancelled
    assert took >= 0.3, "the compaction was not given its grace"
    assert not pool.tasks
    assert not await store.redis.exists(keys.lock), "the lock outlived the handed-back compaction"
    assert published.on("compaction.completed") == []
    assert (await store.meta("c")).version == 0
    assert await jobs.due(10) == ["c"], "the job is not due again"

    # Another worker's pool finishes it right away.
    other = _pool(parts, published, ExtractiveSummarizer(COUNT))
    assert (await other.sweep()).done == 1
    await asyncio.wait_for(asyncio.gather(*other.tasks.values()), 10)
    (done,) = published.on("compaction.completed")
    assert done["outcome"] == Outcome.COMPACTED.value
    assert (await store.meta("c")).version == 1
    assert await jobs.pending_count() == 0
    await other.stop(grace=1)


# --- the turns consumer's acknowledgement contract, in process ---------------------------


def records(
    topic: str, *events: tuple[bytes, bytes], partition: int = 0
) -> dict[TopicPartition, list[Record]]:
    """One partition's batch: (key, value) pairs at offsets 0, 1, 2..."""
    return {
        TopicPartition(topic, partition): [
            ConsumerRecord(topic, partition, offset, 0, 0, key, value, None, len(key), len(value), [])
            for offset, (key, value) in enumerate(events)
        ]
    }


class TestAcknowledgement:
    """The worker's turn handling over a batch (consumer.handle_batch): what is committed, what comes back.

    A batch's offsets are committed only up to the first turn that is neither stored nor
    dead-lettered; an infrastructure error rewinds the partition to that turn, so Kafka
    delivers it again. Dead letters go through FastStream's in-memory test broker. The
    real-broker versions are in tests/integration (test_consumer_batches.py, test_outages.py).
    """

    @pytest.fixture
    def in_process(self) -> Settings:
        """The in-process settings with a (never contacted) broker address."""
        return make_settings(kafka={"bootstrap_servers": "in-process:9092"})

    async def _deliver(
        self, worker: Worker, *events: tuple[bytes, bytes]
    ) -> tuple[BatchResult, TopicPartition, list[bytes]]:
        """Handle one batch of keyed turns; the result, its partition and any DLQ records."""
        letters: list[bytes] = []

        @worker.broker.subscriber(worker.settings.topics.dlq)
        async def dead_letters(message: KafkaMessage) -> None:
            letters.append(message.body)

        batch = records(worker.settings.topics.turns, *events)
        async with TestKafkaBroker(worker.broker):
            result = await handle_batch(batch, worker.consumer.handle, asyncio.Semaphore(8))
        (tp,) = batch
        return result, tp, letters

    @pytest.mark.integration
    async def test_a_stored_turn_is_committed(
        self, in_process: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """Appended, then its offset committed; nothing goes to the DLQ."""
        outcomes: list[TurnOutcome] = []
        worker = build_worker(in_process, redis_client=redis_client, on_turn=outcomes.append)

        result, tp, letters = await self._deliver(worker, (b"c", turn_bytes("c", 1, [user("hello")])))

        assert (result.commits, result.rewinds) == ({tp: 1}, {})
        assert [o.status for o in outcomes] == [TurnStatus.APPENDED]
        assert (await worker.store.meta("c")).last_seq == 1
        assert (worker.handled, letters) == (1, [])

    @pytest.mark.integration
    async def test_a_bad_turn_is_dead_lettered_then_committed(
        self, in_process: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """Bad JSON: one DLQ record with the original bytes, then committed, so it never blocks the partition."""
        worker = build_worker(in_process, redis_client=redis_client)

        result, tp, letters = await self._deliver(worker, (b"c", b"{not json"))

        assert (result.commits, result.rewinds) == ({tp: 1}, {})
        (letter,) = [DeadLetter.model_validate_json(body) for body in letters]
        assert (letter.reason.value, base64.b64decode(letter.original_b64)) == (
            "malformed_json",
            b"{not json",
        )
        assert await all_keys(redis_client) == []
        assert worker.handled == 1

    @pytest.mark.integration
    async def test_a_poison_turn_mid_batch_is_dead_lettered_alone(
        self, in_process: Settings, redis_client: redis.asyncio.Redis
    ) -> None:
        """A bad turn between good ones of its conversation and another: it alone is dead-lettered, all is committed."""
        worker = build_worker(in_process, redis_client=redis_client)

        result, tp, letters = await self._deliver(
            worker,
            (b"a", turn_bytes("a", 1, [user("one")])),
            (b"b", turn_bytes("b", 1, [user("one")])),
            (b"a", b'{"conversation_id": "a", "turn_seq": "2"}'),
            (b"a", turn_bytes("a", 2, [user("two")])),
            (b"b", turn_bytes("b", 2, [user("two")])),
        )

        assert (result.commits, result.rewinds, result.handled) == ({tp: 5}, {}, 5)
        (letter,) = [DeadLetter.model_validate_json(body) for body in letters]
        assert (letter.reason.value, letter.conversation_id, letter.offset) == ("schema_violation", "a", 2)
        assert [(await worker.store.meta(c)).last_seq for c in "ab"] == [2, 2]

    async def test_a_turn_met_by_a_redis_outage_is_rewound(self, in_process: Settings) -> None:
        """Redis unreachable: nothing committed, the partition rewound to the turn, nothing dead-lettered."""
        unreachable = redis.asyncio.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
        worker = build_worker(in_process, redis_client=unreachable)
        try:
            result, tp, letters = await self._deliver(worker, (b"c", turn_bytes("c", 1, [user("hello")])))
        finally:
            await unreachable.aclose()

        assert (result.commits, result.rewinds) == ({}, {tp: 0})
        assert isinstance(result.error, redis.exceptions.ConnectionError)
        assert (worker.handled, letters) == (0, [])


def test_a_serving_worker_freezes_what_it_loaded_at_start_and_collects_the_young_less_often() -> None:
    """LiteLLM's objects live as long as the process: frozen, full collections stop walking them;
    a young collection waits for YOUNG_GC_THRESHOLD allocations, not CPython's 700."""
    before = gc.get_threshold()
    _litellm.load()  # what a worker whose summaries an LLM writes loads at start
    try:
        tune_gc()
        assert gc.get_freeze_count() > 100_000  # LiteLLM alone is a few hundred thousand objects
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def _python(code: str, **env: str) -> list[str]:
    """What a fresh interpreter running ``code`` prints, word by word (this process has LiteLLM loaded)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
        check=True,
    )
    return done.stdout.split()


def test_a_worker_starts_without_litellm_even_when_an_llm_writes_its_summaries() -> None:
    """Issue 54: what a first turn needs (tokenizers, the window registry) loads before the worker
    consumes; LiteLLM (seconds of CPU, which a backlog's turns would share) not even on a thread."""
    code = (
        "import sys, threading\n"
        "from compaction_worker.runtime.worker import warm_up\n"
        "from compaction_worker.settings import Settings\n"
        "settings = Settings()\n"
        "assert settings.summarizer.model == 'openai/gpt-4o-mini'\n"
        "warm_up(settings, tune=True)\n"
        "print('litellm' in sys.modules, threading.active_count())\n"
    )
    assert _python(code, COMPACTION_SUMMARIZER__MODEL="openai/gpt-4o-mini") == ["False", "1"]


def test_litellm_loaded_after_a_worker_froze_its_start_is_frozen_too() -> None:
    """LiteLLM loads at the first LLM summary, after the start froze what the process held: its
    objects are frozen then, so full collections still skip them; a process that froze nothing
    (a test, a script) is left as it is."""
    code = (
        "import asyncio, gc\n"
        "from compaction_worker import _litellm\n"
        "from compaction_worker.runtime.worker import tune_gc\n"
        "if {tune}:\n"
        "    tune_gc()\n"
        "before = gc.get_freeze_count()\n"
        "asyncio.run(_litellm.loaded())\n"
        "print(gc.get_freeze_count() - before > 100_000, gc.get_freeze_count() > 0)\n"
    )
    assert _python(code.format(tune=True)) == ["True", "True"]
    assert _python(code.format(tune=False)) == ["False", "False"]


def test_summaries_due_at_once_wait_for_one_import_and_survive_a_cancelled_waiter() -> None:
    """Every waiter shares one import on a thread of its own; cancelling one does not cancel it."""
    code = (
        "import asyncio, sys, threading\n"
        "from compaction_worker import _litellm\n"
        "async def main():\n"
        "    waiters = [asyncio.create_task(_litellm.loaded()) for _ in range(20)]\n"
        "    await asyncio.sleep(0.05)\n"
        "    names = sorted(t.name for t in threading.enumerate() if t.name != 'MainThread')\n"
        "    waiters[0].cancel()\n"
        "    done = await asyncio.gather(*waiters[1:])\n"
        "    print(names, all(m is sys.modules['litellm'] for m in done))\n"
        "asyncio.run(main())\n"
    )
    assert _python(code) == ["['load-litellm']", "True"]
