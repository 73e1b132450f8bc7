"""The bench's input: turns shaped like real runtimes', published with aiokafka, counted as stored in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from compaction_worker.bench.environment import BenchEnv, BenchError
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.formats import tool_call
from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.runtime.topics import create_topics
from compaction_worker.state.connection import is_cluster
from compaction_worker.testing import turn_payload

MODELS = (
    "openrouter/openai/gpt-4.1",
    "azure/gpt-4o",
    "anthropic/claude-3-5-sonnet-20241022",
    "openrouter/anthropic/claude-3.5-sonnet",
)
"""Model strings as runtimes send them, routing prefixes and all; every window is >= 128K tokens."""

PARTITIONS = 8

_SUM_LAST_SEQ = """
local total = 0
for _, key in ipairs(KEYS) do
  total = total + (tonumber(redis.call('HGET', key, 'last_seq')) or 0)
end
return total
"""
_LAST_SEQS = "local out = {} for i, key in ipairs(KEYS) do out[i] = redis.call('HGET', key, 'last_seq') or 0 end return out"


def agent_turn(seq: int, cid: str, output_lines: int = 12) -> list[dict[str, Any]]:
    """One agent step: a request, a tool call (its id reused every turn, as runtimes do), its output, a reply."""
    path = f"src/{cid[-4:]}/module_{seq % 23}.py"
    output = "\n".join(
        f"{path}:{k * 7 + seq}: def step_{k}(event): return handle(event, retries={k % 4})"
        for k in range(output_lines)
    )
    return [
        {"role": "user", "content": f"Step {seq}: the test in `{path}` fails with KeyError 'id'. Fix it."},
        {
            "role": "assistant",
            "content": "Reading the module.",
            "tool_calls": [tool_call("call_0", "read_file", json.dumps({"path": path}))],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {
            "role": "assistant",
            "content": f"`{path}` reads event['id'] before checking it; fixed in step {seq}.",
        },
    ]


def encode(cid: str, seq: int, model: str, output_lines: int = 12, **fields: Any) -> bytes:
    """One ``conversation.turn`` event's bytes (validated by the contract's model)."""
    event = turn_payload(cid, seq, agent_turn(seq, cid, output_lines), model=model, **fields)
    return json.dumps(event, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Input:
    """Turns of many conversations, each conversation's in order, interleaved as concurrent runtimes send them."""

    conversations: tuple[str, ...]
    turns: int
    events: tuple[tuple[bytes, bytes], ...]
    """(key, value) in publishing order."""

    @property
    def total(self) -> int:
        return len(self.conversations) * self.turns


def make_input(conversations: int, turns: int, prefix: str = "conv") -> Input:
    """``conversations`` x ``turns`` turns, round-robin over the conversations (no compaction due)."""
    cids = tuple(f"{prefix}-{i:05d}" for i in range(conversations))
    events = tuple(
        (cid.encode(), encode(cid, seq, MODELS[i % len(MODELS)]))
        for seq in range(1, turns + 1)
        for i, cid in enumerate(cids)
    )
    return Input(cids, turns, events)


def warmup_input(partitions: int = PARTITIONS) -> Input:
    """One turn per model on every partition: each consumer's first turns of each model (loading its
    tokenizer, its window) are done before the timed input is sent."""
    choose, every = DefaultPartitioner(), list(range(partitions))
    wanted = {(p, m) for p in every for m in range(len(MODELS))}
    cids: list[str] = []
    events: list[tuple[bytes, bytes]] = []
    index = 0
    while wanted:
        cid, index = f"warmup-{index:05d}", index + 1
        model = index % len(MODELS)
        slot = (choose(cid.encode(), every, every), model)
        if slot in wanted:
            wanted.discard(slot)
            cids.append(cid)
            events.append((cid.encode(), encode(cid, 1, MODELS[model])))
    return Input(tuple(cids), 1, tuple(events))


def _topics(turns: str) -> list[str]:
    """A bench turns topic and the worker's other topics, named after it."""
    return [turns, f"{turns}.started", f"{turns}.completed", f"{turns}.dlq"]


@contextlib.asynccontextmanager
async def _admin(env: BenchEnv) -> AsyncIterator[AIOKafkaAdminClient]:
    """An admin client of the bench's broker, closed on leaving."""
    kafka = env.settings.kafka
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers, **kafka_client_args(kafka))
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def new_topic(env: BenchEnv, partitions: int = PARTITIONS) -> str:
    """Create a fresh turns topic (the worker's other topics are named after it) and return its name."""
    name = env.unique("turns")
    kafka = env.settings.kafka
    assert kafka.bootstrap_servers
    await create_topics(
        kafka.bootstrap_servers,
        _topics(name),
        partitions,
        env.settings.topics.replication_factor,
        **kafka_client_args(kafka),
    )
    return name


async def drop_topic(env: BenchEnv, name: str) -> None:
    """Delete a bench topic and the worker's topics named after it (best effort: a broker may refuse)."""
    async with _admin(env) as admin:
        # Left behind if refused: each run's names are fresh, so nothing reads them again.
        with contextlib.suppress(KafkaError):
            await admin.delete_topics(_topics(name))


def topic_overrides(topic: str, group: str, prefix: str) -> dict[str, str]:
    """The worker settings (``COMPACTION_`` names) that point it at a bench topic, group and key prefix."""
    names = ("TOPICS__TURNS", "TOPICS__STARTED", "TOPICS__COMPLETED", "TOPICS__DLQ")
    return {
        **dict(zip(names, _topics(topic), strict=True)),
        "KAFKA__GROUP_ID": group,
        "REDIS__KEY_PREFIX": prefix,
        "LOG_LEVEL": "WARNING",
    }


def producer(env: BenchEnv, **options: Any) -> AIOKafkaProducer:
    """An aiokafka producer for the bench's broker (no idempotence: the embedded broker lacks it)."""
    kafka = env.settings.kafka
    return AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        enable_idempotence=False,
        **{"max_request_size": 4 << 20, **kafka_client_args(kafka), **options},
    )


class Batches:
    """Input encoded into record batches ahead of a run, so that sending it costs the run next to no CPU."""

    def __init__(
        self, env: BenchEnv, events: Sequence[tuple[bytes, bytes]], partitions: int = PARTITIONS
    ) -> None:
        self.out = producer(env, max_batch_size=1 << 20, max_request_size=8 << 20)
        self.events, self.partitions = events, partitions

    async def __aenter__(self) -> Batches:
        await self.out.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.out.stop()

    def build(self, events: Sequence[tuple[bytes, bytes]] | None = None) -> list[tuple[int, Any]]:
        """(partition, BatchBuilder) for every event, each partition's in publishing order (the default partitioner's)."""
        choose, every = DefaultPartitioner(), list(range(self.partitions))
        batches: list[tuple[int, Any]] = []
        open_batch: dict[int, Any] = {}
        for key, value in self.events if events is None else events:
            partition = choose(key, every, every)
            batch = open_batch.get(partition)
            if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
                batch = open_batch[partition] = self.out.create_batch()
                batches.append((partition, batch))
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise BenchError("an event larger than a batch")
        return batches

    async def send(self, topic: str, batches: list[tuple[int, Any]]) -> dict[int, int]:
        """Send built batches and wait until the broker has them all; returns each partition's end offset."""
        sent = [await self.out.send_batch(batch, topic, partition=partition) for partition, batch in batches]
        ends: dict[int, int] = {}
        for (partition, batch), metadata in zip(batches, await asyncio.gather(*sent), strict=True):
            ends[partition] = max(ends.get(partition, 0), metadata.offset + batch.record_count())
        return ends


async def wait_group(env: BenchEnv, group: str, processes: int, within: float = 60.0) -> None:
    """Wait until ``group`` is Stable, its members unchanged for 2 seconds (1 on a small run), one per process at least.

    A worker process may hold several consumers (``kafka.consumers``), which join one by one:
    members that stay put for a while mean every process has its partitions.
    """
    settle = 2.0 if env.scale >= 1 else 1.0
    async with _admin(env) as admin:
        deadline = time.monotonic() + within
        seen: tuple[frozenset[str], float] = (frozenset(), 0.0)
        while True:
            described = (await admin.describe_consumer_groups([group]))[0].to_object()["groups"][0]
            members = frozenset(m["member_id"] for m in described["members"])
            now = time.monotonic()
            if described["state"] != "Stable" or len(members) < processes:
                seen = (frozenset(), now)
            elif members != seen[0]:
                seen = (members, now)
            elif now - seen[1] >= settle:
                return
            if now > deadline:
                raise BenchError(
                    f"group {group} not stable: {described['state']}, {len(members)} members "
                    f"(the workers' logs: {env.workdir})"
                )
            await asyncio.sleep(0.1)


async def wait_committed(
    env: BenchEnv,
    group: str,
    topic: str,
    ends: dict[int, int],
    *,
    alive: Any,
    within: float,
    poll: float = 0.02,
) -> None:
    """Wait until ``group`` has committed every partition of ``topic`` up to ``ends``: all handled.

    It asks the broker, not Redis, so that the Redis figures of a run hold the worker's commands only.
    """
    async with _admin(env) as admin:
        deadline = time.monotonic() + within
        while True:
            committed = await admin.list_consumer_group_offsets(
                group, partitions=list(map(TopicPartition, [topic] * len(ends), ends))
            )
            behind = {
                p: end
                for p, end in ends.items()
                if (c := committed.get(TopicPartition(topic, p))) is None or c.offset < end
            }
            if not behind:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"group {group} did not commit {topic} up to {ends} within {within:.0f}s")
            alive()
            await asyncio.sleep(poll)


async def delete_prefix(env: BenchEnv, prefix: str) -> None:
    """Delete a run's keys, so that Redis does not grow run after run (one key at a time on a cluster)."""
    batch: list[str | bytes] = []
    step = 1 if is_cluster(env.redis) else 1000  # a multi-key UNLINK must keep to one slot on a cluster
    async for key in env.redis.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= step:
            await env.redis.unlink(*batch)
            batch = []
    if batch:
        await env.redis.unlink(*batch)


@dataclass(frozen=True, slots=True)
class Attached:
    """Worker processes holding a fresh topic's partitions, warmed up: where a scenario sends its input."""

    topic: str
    group: str
    prefix: str
    """The workers' Redis key prefix."""
    batches: Batches
    alive: Callable[[], None]
    """Raises BenchError if a worker process exited."""


class StoredCounter:
    """How many turns Redis holds for a set of conversations: the sum of their ``last_seq``.

    One script call on a single Redis; on a cluster, whose conversations sit on many slots, one
    pipelined HGET per conversation.
    """

    def __init__(self, env: BenchEnv, prefix: str, conversations: Sequence[str]) -> None:
        self.redis = env.redis
        self.keys = [conversation_keys(cid, prefix).meta for cid in conversations]
        self.cluster = is_cluster(env.redis)
        self._sum = env.redis.register_script(_SUM_LAST_SEQ)
        self._each = env.redis.register_script(_LAST_SEQS)

    async def stored(self) -> int:
        if self.cluster:
            return sum(await self._hget_each(self.keys))
        return int(await self._sum(keys=self.keys))

    async def last_seqs(self, indexes: Sequence[int]) -> list[int]:
        """Each listed conversation's last stored seq."""
        if not indexes:
            return []
        keys = [self.keys[i] for i in indexes]
        if self.cluster:
            return await self._hget_each(keys)
        return [int(v) for v in await self._each(keys=keys)]

    async def _hget_each(self, keys: Sequence[str]) -> list[int]:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "last_seq")
        return [int(v or 0) for v in await pipe.execute()]


async def stored_rate(
    counter: StoredCounter, total: int, *, alive: Any, within: float, poll: float = 0.02
) -> float:
    """Turns stored per second, from the first stored turn to the last (start-up and group join left out).

    ``alive()`` raises if the processes storing them died; BenchError after ``within`` seconds.
    """
    deadline = time.monotonic() + within
    first: tuple[float, int] | None = None
    while True:
        now, stored = time.monotonic(), await counter.stored()
        if first is None and stored > 0:
            first = (now, stored)
        if stored >= total and first is not None:
            # All in one poll (a tiny input): the poll interval bounds the time it took.
            return ((total - first[1]) or total) / max(now - first[0], poll)
        if now > deadline:
            raise BenchError(f"only {stored} of {total} turns stored within {within:.0f}s")
        alive()
        await asyncio.sleep(poll)
