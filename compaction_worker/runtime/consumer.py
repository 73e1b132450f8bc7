"""The turns consumer: batches per partition, conversations concurrently, one commit per batch.

Each consumer of the group fetches a batch (aiokafka ``getmany``). A partition's turns are
grouped by key, the conversation: conversations run concurrently, each one's turns in order
(several consecutive turns of one conversation may be stored by one call: runtime/runs.py).
Then one commit covers, per partition, every offset before the first turn that was neither
stored nor dead-lettered (an infrastructure error); the partition is rewound to that turn, so
it and the turns after it come back. At-least-once: a turn delivered again is a duplicate the
turn handler recognises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from compaction_worker.observability.health import Liveness
from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.runtime.turns import is_outage
from compaction_worker.settings import Settings

log = logging.getLogger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]
Handle = Callable[[Record], Awaitable[None]]
"""Handles one turn: returns once it is stored or dead-lettered, raises if it must come back (an
outage: the turn handler itself retries, then dead-letters, a turn that fails for any other reason)."""
HandleRun = Callable[[Sequence[Record]], Awaitable[int]]
"""Handles the leading records of one conversation's (one or more, in order) and returns how many,
each stored or dead-lettered; raises as :data:`Handle` does, for the first of them."""
ObserveLag = Callable[[str, int, int], None]
"""Called with (topic, partition, lag) for each partition of a batch, after it is handled."""


@dataclass(slots=True)
class BatchResult:
    """What a batch came to: per partition, the offset to commit and the offset to rewind to."""

    commits: dict[TopicPartition, int] = field(default_factory=dict)
    """The next offset to consume, for each partition that made progress."""
    rewinds: dict[TopicPartition, int] = field(default_factory=dict)
    """The first turn not handled, for each partition where one failed: it is delivered again."""
    handled: int = 0
    error: BaseException | None = None
    """The first failure (for the log)."""


def conversations(records: Sequence[Record]) -> Iterator[list[Record]]:
    """A partition's records grouped by key, each group in offset order (unkeyed records form one group)."""
    groups: dict[bytes | None, list[Record]] = {}
    for record in records:
        groups.setdefault(record.key, []).append(record)
    return iter(groups.values())


def one_at_a_time(handle: Handle) -> HandleRun:
    """A :data:`HandleRun` that handles the first record only."""

    async def run(records: Sequence[Record]) -> int:
        await handle(records[0])
        return 1

    return run


async def handle_batch(
    batch: Mapping[TopicPartition, Sequence[Record]],
    handle: Handle,
    limit: asyncio.Semaphore,
    handle_run: HandleRun | None = None,
) -> BatchResult:
    """Handle a fetched batch: conversations concurrently, each in order; stop a conversation at its first failure.

    ``limit`` bounds the conversations handled at once (shared by the process's consumers:
    each holds one Redis connection, and the client's pool has a maximum). With ``handle_run``,
    it is given each conversation's records from the first not yet handled, instead of ``handle``
    each record.
    """
    result = BatchResult()
    run = handle_run or one_at_a_time(handle)

    async def one_conversation(tp: TopicPartition, records: list[Record]) -> None:
        async with limit:
            at = 0
            while at < len(records):
                try:
                    done = await run(records[at:])
                except Exception as e:  # any failure: the turn comes back, never skipped
                    # Its later turns wait too: they must not be stored before it.
                    offset = records[at].offset
                    result.rewinds[tp] = min(result.rewinds.get(tp, offset), offset)
                    result.error = result.error or e
                    return
                at += done
                result.handled += done

    await asyncio.gather(
        *(one_conversation(tp, group) for tp, records in batch.items() for group in conversations(records))
    )
    for tp, records in batch.items():
        if not records:
            continue
        # Every turn before the first failure is stored or dead-lettered, whatever its conversation.
        upto = result.rewinds.get(tp, records[-1].offset + 1)
        if upto > records[0].offset:
            result.commits[tp] = upto
    return result


class _WaitForBatch(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped here
    """Partitions are given up only between batches, so a handled batch is committed first."""

    def __init__(self, busy: asyncio.Lock) -> None:
        self.busy = busy
        self.consumer: AIOKafkaConsumer | None = None

    async def on_partitions_revoked(self, _revoked: Any) -> None:
        async with self.busy:
            pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        member = getattr(getattr(self.consumer, "_coordinator", None), "member_id", None)
        partitions = ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))
        log.info("Consumer %s assigned to partitions: (%s)", member, partitions)


class TurnConsumer:
    """``kafka.consumers`` members of the group, each fetching, handling and committing batches."""

    def __init__(
        self,
        settings: Settings,
        handle: Handle,
        liveness: Liveness | None = None,
        observe_lag: ObserveLag | None = None,
        handle_run: HandleRun | None = None,
    ) -> None:
        self.settings = settings
        self.handle = handle
        self.handle_run = handle_run
        self.liveness = liveness
        self.observe_lag = observe_lag
        self.consumers: list[AIOKafkaConsumer] = []
        self.tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._limit = asyncio.Semaphore(settings.kafka.batch_concurrency)

    def _consumer(self, busy: asyncio.Lock) -> AIOKafkaConsumer:
        kafka = self.settings.kafka
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap_servers,
            client_id=kafka.client_id,
            group_id=kafka.group_id,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=kafka.heartbeat_interval_ms,
            max_partition_fetch_bytes=kafka.max_fetch_bytes,
            fetch_max_wait_ms=kafka.fetch_max_wait_ms,
            **kafka_client_args(kafka),
        )
        listener = _WaitForBatch(busy)
        consumer.subscribe(topics=[self.settings.topics.turns], listener=listener)
        listener.consumer = consumer
        return consumer

    async def start(self, ready: Awaitable[object] | None = None) -> None:
        """Join the group with every consumer at once (so they balance) and start their loops once
        ``ready`` is done too (it runs beside the join)."""
        self._stopping = False
        locks = [asyncio.Lock() for _ in range(self.settings.kafka.consumers)]
        self.consumers = [self._consumer(busy) for busy in locks]
        await asyncio.gather(*(c.start() for c in self.consumers), *([ready] if ready is not None else []))
        self.tasks = [
            asyncio.create_task(self._loop(c, busy), name=f"consume-{i}")
            for i, (c, busy) in enumerate(zip(self.consumers, locks, strict=True))
        ]

    async def stop(self, grace: float) -> None:
        """Stop fetching, let the batches in hand finish within ``grace`` (else they come back), leave the group."""
        self._stopping = True
        if self.tasks:
            _, late = await asyncio.wait(self.tasks, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(c.stop() for c in self.consumers), return_exceptions=True)
        self.tasks, self.consumers = [], []

    def group_joined(self) -> bool:
        """Whether every consumer's loop runs and it is a member of the group (partitions or not)."""
        if not self.consumers or any(task.done() for task in self.tasks):
            return False
        # aiokafka's coordinator state: generation -1 until joined (the embedded broker starts at 0).
        coordinators = [getattr(c, "_coordinator", None) for c in self.consumers]
        return all(g is not None and g.coordinator_id is not None and g.generation >= 0 for g in coordinators)

    async def _loop(self, consumer: AIOKafkaConsumer, busy: asyncio.Lock) -> None:
        kafka = self.settings.kafka
        policy = self.settings.retry.turns
        failures = 0  # batches in a row that brought turns back, or fetches that failed
        while not self._stopping:
            try:
                batch = await consumer.getmany(
                    timeout_ms=kafka.batch_timeout_ms, max_records=kafka.batch_max_records
                )
                if self.liveness is not None:
                    self.liveness.beat("consume")  # every poll, an empty one too
                if not batch:
                    continue
                async with busy:
                    result = await handle_batch(batch, self.handle, self._limit, self.handle_run)
                    self._rewind(consumer, result.rewinds)
                    await self._commit(consumer, result.commits)
                self._lag(consumer, batch, result)
            except Exception:  # the loop outlives a failed fetch; nothing was committed for it
                log.exception("consume loop error; retrying")
                failures += 1
                await asyncio.sleep(policy.backoff(failures))
                continue
            if not result.rewinds:
                failures = 0
                continue
            failures += 1
            failed = sum(len(r) for r in batch.values()) - result.handled
            # An outage is expected and logged briefly; anything else is a bug: its traceback.
            infra = result.error is not None and is_outage(result.error)
            log.log(
                logging.WARNING if infra else logging.ERROR,
                "%s on a turn (%s: %s); %d turn(s) will be redelivered",
                "infrastructure error" if infra else "error",
                type(result.error).__name__,
                result.error,
                failed,
                exc_info=None if infra else result.error,
            )
            # Back off, so that an outage is not a hot loop (the wait grows while it lasts).
            await asyncio.sleep(policy.backoff(failures))

    def _rewind(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            try:
                consumer.seek(tp, offset)
            except KafkaError:
                # Revoked meanwhile: its new owner starts at the committed offset, before this one.
                log.info("%s was revoked before it could be rewound", tp)

    async def _commit(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as e:
            # Partitions moved to another member, or the broker is away: the turns after the
            # last committed offset are delivered again (duplicates, recognised as such).
            log.warning("offset commit failed (%s); the batch's turns may be redelivered", e)

    def _lag(
        self,
        consumer: AIOKafkaConsumer,
        batch: Mapping[TopicPartition, Sequence[Record]],
        result: BatchResult,
    ) -> None:
        if self.observe_lag is None:
            return
        for tp, records in batch.items():
            highwater = consumer.highwater(tp)
            if highwater is None or not records:
                continue
            position = result.rewinds.get(tp, records[-1].offset + 1)
            self.observe_lag(tp.topic, tp.partition, max(0, highwater - position))
