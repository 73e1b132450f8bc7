"""The worker process: a FastStream Kafka app over the wired components.

Turns are consumed in batches (consumer.py): an offset is committed once every turn before
it is stored or dead-lettered; an infrastructure error is not, so the turn comes back.
Compactions run on the pool, off the consumer path. Events go out through the publishers
declared in channels.py, and the app's AsyncAPI document is FastStream's, of those channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from faststream import FastStream
from faststream.kafka import KafkaBroker

from compaction_worker.budget.tokens import counter_for
from compaction_worker.budget.windows import resolve_window
from compaction_worker.observability.health import HealthServer
from compaction_worker.observability.metrics import record_lag
from compaction_worker.observability.tracing import (
    ConsumedRecord,
    consume_span,
    inject_dict,
    started_consume_span,
)
from compaction_worker.runtime.channels import declare, make_broker
from compaction_worker.runtime.compactor import Summarizers
from compaction_worker.runtime.components import Components, build_components
from compaction_worker.runtime.connections import connect_redis, worker_client_name
from compaction_worker.runtime.consumer import Record, TurnConsumer
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.runtime.runs import RUN_MAX, append_run
from compaction_worker.runtime.turns import TurnHandler, TurnOutcome
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)


@dataclass
class Worker:
    """One worker process: its components, broker and Redis client; ``app`` is the FastStream application."""

    settings: Settings
    broker: KafkaBroker
    redis: RedisClient
    components: Components
    app: FastStream
    consumer: TurnConsumer
    """The turns topic's consumers (started and stopped with the app)."""
    handled: int = 0
    health: HealthServer | None = None
    """The health port while it runs (``health.enabled``)."""
    tune_gc_at_start: bool = False
    """Tune the process's garbage collector at start (:func:`tune_gc`): set by :meth:`serve`."""

    @property
    def store(self) -> Store:
        return self.components.store

    @property
    def turns(self) -> TurnHandler:
        return self.components.turns

    @property
    def pool(self) -> CompactionPool:
        return self.components.pool

    async def serve(self, on_consuming: Callable[[], None] | None = None) -> None:
        """Run until SIGINT/SIGTERM, then shut down gracefully; ``on_consuming`` once the consumers run.

        The garbage collector is tuned once the start has loaded what turns need (a worker
        process's own choice: tests and the demo run in a process of their own); LiteLLM loads at
        the first LLM summary (``_litellm.loaded``), never before.
        """

        self.tune_gc_at_start = True
        if on_consuming is not None:

            async def started() -> None:
                on_consuming()

            self.app.after_startup(started)  # after build_worker's own hook, which starts consuming
        await self.app.run()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Worker]:
        """Run inside an ``async with`` block (the demo and tests): start, yield, stop."""
        async with self.app.lifespan_context():
            await self.app.start()
            try:
                yield self
            finally:
                await self.app.stop()

    def __repr__(self) -> str:
        return f"<Worker handled={self.handled} {self.pool!r} {self.turns.gaps!r}>"


def _consumed(record: Record, group: str) -> ConsumedRecord:
    """What a record's consume span says of it."""
    return ConsumedRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        group=group,
        conversation_id=record.key.decode(errors="replace") if record.key else "",
        headers=record.headers,
    )


def build_worker(
    settings: Settings,
    summarizers: Summarizers | None = None,
    redis_client: RedisClient | None = None,
    on_turn: Callable[[TurnOutcome], None] | None = None,
) -> Worker:
    """Wire a worker from settings: broker, Redis, the components, the turns consumer and the app."""
    kafka = settings.kafka
    if not kafka.bootstrap_servers:
        raise ValueError("no Kafka bootstrap servers configured")
    broker = make_broker(kafka, graceful_timeout=settings.worker.shutdown_grace_seconds)
    channels = declare(broker, settings.topics, kafka)
    publishers = channels.publishers
    client = redis_client or connect_redis(settings.redis, worker_client_name())

    async def publish(topic: str, payload: bytes, key: bytes | None) -> None:
        headers = {"content-type": "application/json"}
        inject_dict(headers)  # the current trace (a compaction's run span) travels with its events
        await publishers[topic].publish(payload, key=key, headers=headers)

    parts = build_components(settings, client, publish, summarizers=summarizers)
    turns, pool = parts.turns, parts.pool

    async def handle(record: Record) -> None:
        with consume_span(**_consumed(record, kafka.group_id)):
            # An infrastructure error propagates: the consumer rewinds to this turn.
            outcome = await turns.handle(record.value or b"", record.key, record.partition, record.offset)
        worker.handled += 1
        if on_turn is not None:
            on_turn(outcome)

    async def handle_run(records: Sequence[Record]) -> int:
        # Consecutive turns of one conversation in one script call (runtime/runs.py), else the first alone;
        # each turn of a run keeps its own consume span, started and not current.
        outcomes = await append_run(
            turns,
            [(r.value or b"", r.key) for r in records[:RUN_MAX]],
            lambda index: started_consume_span(**_consumed(records[index], kafka.group_id)),
        )
        if not outcomes:
            await handle(records[0])
            return 1
        worker.handled += len(outcomes)
        if on_turn is not None:
            for outcome in outcomes:
                on_turn(outcome)
        return len(outcomes)

    consumer = TurnConsumer(settings, handle, parts.liveness, observe_lag=record_lag, handle_run=handle_run)

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        await client.ping()
        if settings.health.enabled:
            worker.health = HealthServer(settings.health, parts.liveness, _readiness(worker, client))
            await worker.health.start()
        try:
            yield
        finally:
            if worker.health is not None:
                await worker.health.stop()
            await client.aclose()

    app = FastStream(broker, lifespan=lifespan, specification=channels.specification)
    worker = Worker(settings, broker, client, parts, app, consumer)

    @app.after_startup
    async def consume() -> None:
        # After the broker: a turn's dead letter is published through it. The tokenizers load beside
        # the group join, off the loop (a load on the loop would stall a held lock's renewals: stale
        # fence). LiteLLM, which only an LLM summary needs, loads at the first one: importing it
        # here, even on a thread, took a third of a new worker's CPU from the turns of its backlog.
        await consumer.start(ready=asyncio.to_thread(warm_up, settings, tune=worker.tune_gc_at_start))
        pool.start()

    @app.on_shutdown
    async def drain() -> None:
        # Stop taking turns first (the batches in hand finish and commit), then give running
        # compactions the grace period; the broker is still up so their events are published.
        await consumer.stop(settings.worker.shutdown_grace_seconds)
        await pool.stop(settings.worker.shutdown_grace_seconds)

    return worker


def warm_up(settings: Settings, *, tune: bool = False) -> None:
    """Load what a first turn would otherwise load on the event loop: the common tokenizers
    (o200k_base, cl100k_base) and LiteLLM's model map (the window registry); then, with ``tune``,
    tune the garbage collector over what the process holds (:func:`tune_gc`)."""
    for model in ("gpt-4o", "gpt-4"):
        counter_for(model, settings.budget).text("warm up")
    resolve_window("gpt-4o", settings.budget)
    if tune:
        tune_gc()


YOUNG_GC_THRESHOLD = 50_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def tune_gc() -> None:
    """Exempt what the process holds at start from garbage collection, and collect the young less often.

    What lives as long as the process (the tokenizers, the model map, and LiteLLM's ~300K
    objects, which ``_litellm.load`` freezes when it loads later) was walked by every full
    collection: it cost a 500K-token compaction about a quarter of its time (bench: compaction cost).

    A turn allocates ~100 objects that refcounting frees (its models, dicts, records), and a
    batch in flight holds thousands: at CPython's default a young collection ran every few
    turns and walked the batch's live objects each time, ~10% of a stored turn's CPU (178
    against 197 us with this, docs/performance.md). Cyclic garbage waits at most
    ``YOUNG_GC_THRESHOLD`` allocations.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, old)


def _readiness(worker: Worker, client: RedisClient) -> dict[str, Callable[[], Awaitable[bool]]]:
    """The /readyz checks: Redis answers, the broker answers, the consumer group is joined."""

    async def redis_ping() -> bool:
        return bool(await client.ping())

    async def broker_ping() -> bool:  # a metadata request
        return await worker.broker.ping(timeout=worker.settings.health.check_timeout_seconds)

    async def group() -> bool:  # every turns consumer runs and is a member of the group (partitions or not)
        return worker.consumer.group_joined()

    return {"redis": redis_ping, "broker": broker_ping, "group": group}
