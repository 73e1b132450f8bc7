"""The worker process: a FastStream Kafka app, its Redis connection and its compaction pool.

Turns are handled on the consumer path and acknowledged (offsets committed) only after
their state is stored; bad input is dead-lettered and acknowledged; an infrastructure
error is not acknowledged, so the event comes back. Compactions run on a bounded pool of
tasks fed by the job index, so a slow LLM call never holds up a partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions
from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from redis.asyncio import Redis

from compaction_worker.budget.tokens import TokenCounter
from compaction_worker.local.embedded import create_topics
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.connections import connect_redis, kafka_client_args, kafka_security
from compaction_worker.runtime.turns import TurnHandler, TurnOutcome
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Locks
from compaction_worker.state.store import Store
from compaction_worker.summaries.llm import Summarizer

log = logging.getLogger(__name__)

# Errors that mean "the infrastructure is down", not "this event is bad".
INFRA_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    OSError,
)


@dataclass
class CompactionPool:
    """Runs due compactions on at most ``size`` concurrent tasks, fed by the job index."""

    compactor: Compactor
    jobs: JobQueue
    size: int
    sweep_interval: float
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    chores: list[Callable[[], Awaitable[object]]] = field(default_factory=list)
    """Other periodic work that rides on the sweeper's loop (expiring turns held behind a gap,
    publishing completion events that a dead worker left in the outbox)."""
    completed: int = 0
    failed: int = 0
    _sweeper: asyncio.Task[None] | None = None
    _stopping: bool = False

    def start(self) -> None:
        """Start the sweeper that picks up due jobs (ours, and those of dead workers)."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="compaction-sweeper")

    def submit(self, conversation_id: str) -> None:
        """Fast path after a turn scheduled a job: run it now if a slot is free."""
        if self._stopping or conversation_id in self.tasks or len(self.tasks) >= self.size:
            return  # the sweeper will find it
        self._spawn(conversation_id)

    def _spawn(self, conversation_id: str) -> None:
        task = asyncio.create_task(self._run(conversation_id), name=f"compaction:{conversation_id}")
        self.tasks[conversation_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(conversation_id, None))

    async def _run(self, conversation_id: str) -> None:
        try:
            claim = await self.jobs.claim(conversation_id)
            if claim is None:
                return
            try:
                completed = await self.compactor.run(claim)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.jobs.hand_back(claim))
                raise
            if completed is not None:
                self.completed += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # one conversation's failure must not stop the pool
            self.failed += 1
            log.exception("compaction task for %s failed", conversation_id)

    async def _sweep_forever(self) -> None:
        while not self._stopping:
            for work in (self.sweep, *self.chores):
                try:
                    await work()
                except Exception:  # Redis or Kafka away: try again next interval
                    log.warning("sweep failed", exc_info=True)
            await asyncio.sleep(self.sweep_interval)

    async def sweep(self) -> int:
        """Start tasks for due jobs while slots are free; returns how many started."""
        free = self.size - len(self.tasks)
        if free <= 0:
            return 0
        started = 0
        for cid in await self.jobs.due(free * 2):
            if len(self.tasks) >= self.size:
                break
            if cid not in self.tasks:
                self._spawn(cid)
                started += 1
        return started

    async def stop(self, grace: float) -> None:
        """Stop sweeping, let running compactions finish within ``grace``, hand back the rest."""
        self._stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        running = list(self.tasks.values())
        if running:
            _, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
                log.warning("handed back %d unfinished compactions", len(pending))

    def __repr__(self) -> str:
        return f"<CompactionPool running={len(self.tasks)}/{self.size} completed={self.completed} failed={self.failed}>"


@dataclass
class Worker:
    """One worker process's parts, wired together; ``app`` is the FastStream application."""

    settings: Settings
    broker: KafkaBroker
    redis: Redis
    store: Store
    turns: TurnHandler
    pool: CompactionPool
    app: FastStream
    handled: int = 0

    async def serve(self) -> None:
        """Run until SIGINT/SIGTERM, then shut down gracefully."""
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


def build_worker(
    settings: Settings,
    summarizers: Callable[[str, TokenCounter], Sequence[Summarizer]] | None = None,
    redis_client: Redis | None = None,
    on_turn: Callable[[TurnOutcome], None] | None = None,
) -> Worker:
    """Wire a worker from settings: broker, subscriber, Redis, store, pool and app."""
    kafka = settings.kafka
    if not kafka.bootstrap_servers:
        raise ValueError("no Kafka bootstrap servers configured")
    broker = KafkaBroker(
        kafka.bootstrap_servers,
        client_id=kafka.client_id,
        enable_idempotence=kafka.enable_idempotence,
        acks="all",
        security=kafka_security(kafka),
        logger=logging.getLogger("compaction_worker.broker"),
        log_level=logging.DEBUG,  # one line per message is too much at INFO
        graceful_timeout=settings.worker.shutdown_grace_seconds,
    )
    client = redis_client or connect_redis(settings.redis)
    store = Store(client, settings.redis.key_prefix, settings.redis.retention_seconds)
    jobs = JobQueue(store, lease_seconds=settings.worker.lock_ttl_seconds * 2)
    locks = Locks(client, settings.worker.lock_ttl_seconds)

    async def publish(topic: str, payload: bytes, key: bytes | None) -> None:
        await broker.publish(payload, topic, key=key, headers={"content-type": "application/json"})

    compactor = Compactor(settings, store, locks, jobs, publish, summarizers=summarizers)
    pool = CompactionPool(
        compactor,
        jobs,
        size=settings.worker.max_concurrent_compactions,
        sweep_interval=settings.worker.sweep_interval_seconds,
    )
    turns = TurnHandler(settings, store, jobs, publish, on_scheduled=pool.submit)
    pool.chores.append(turns.gaps.expire)
    pool.chores.append(compactor.outbox.relay)  # completion events whose worker died

    subscriber = broker.subscriber(
        settings.topics.turns,
        group_id=kafka.group_id,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        max_workers=kafka.consumers,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        max_partition_fetch_bytes=max(kafka.max_event_bytes * 2, 1_048_576),
        decoder=_raw_body,
        title="conversation.turn",
        description="One turn of one conversation, keyed by conversation_id.",
    )

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        await client.ping()
        pool.start()
        try:
            yield
        finally:
            await client.aclose()

    app = FastStream(broker, lifespan=lifespan)
    worker = Worker(settings, broker, client, store, turns, pool, app)

    @subscriber
    async def consume_turn(message: KafkaMessage) -> None:
        record = message.raw_message
        assert not isinstance(record, tuple), "the turn subscriber is not a batch subscriber"
        raw = record.value if isinstance(record.value, bytes) else bytes(record.value or b"")
        try:
            outcome = await turns.handle(raw, record.key, record.partition, record.offset)
        except INFRA_ERRORS:
            # Not acknowledged: the event is redelivered. Pause so a Redis outage is not a hot loop.
            log.warning("infrastructure error on a turn; it will be redelivered", exc_info=True)
            await asyncio.sleep(settings.worker.retry_backoff_seconds)
            raise
        worker.handled += 1
        if on_turn is not None:
            on_turn(outcome)

    @app.on_shutdown
    async def drain() -> None:
        # Stop taking turns first, then give running compactions the grace period; the
        # broker is still up so their events are published.
        await subscriber.stop()
        await pool.stop(settings.worker.shutdown_grace_seconds)

    return worker


async def _raw_body(message: Any) -> bytes:
    """Keep the body as bytes: the handler validates it itself, so bad JSON can be dead-lettered."""
    body = message.body
    return body if isinstance(body, bytes) else bytes(body or b"")


async def ensure_topics(settings: Settings) -> list[str]:
    """Create the four topics if missing, with the configured partition count."""
    topics = settings.topics
    assert settings.kafka.bootstrap_servers
    return await create_topics(
        settings.kafka.bootstrap_servers,
        [topics.turns, topics.started, topics.completed, topics.dlq],
        topics.partitions,
        topics.replication_factor,
        **kafka_client_args(settings.kafka),
    )
