"""Outages under a running worker: Redis restarted mid-run, then the broker restarted mid-run.

Each test restarts a server of its own (never the session's shared ones) under a real
in-process worker. The worker's Kafka consumers, its producer and its Redis client are
ordinary network clients, so what they live through here is what a worker process lives
through: connections refused, then servers back on the same port. The time from each
restart to the first turn stored afterwards is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, TurnEvent
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis
from compaction_worker.runtime.topics import create_topics
from compaction_worker.runtime.turns import TurnOutcome, TurnStatus
from compaction_worker.runtime.worker import Worker, build_worker
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import fake_summarizer, fresh_topics, make_settings

from .helpers import (
    compaction_events,
    coverage_problems,
    group_offsets,
    poll_until,
    read_topic,
)

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

CONVERSATIONS = 4
PARTITIONS = 4
WINDOW = 3000  # small, so that compactions run before, during and after the outages
INFRA_WARNING = "infrastructure error on a turn"
ASSIGNED = re.compile(r"Consumer (\S+) assigned to partitions")
# Short leases and back-off: a compaction cut off by an outage is taken up again soon.
WORKER = {"lock_ttl_seconds": 2.0}
RETRY = {"base_seconds": 0.5, "cap_seconds": 1.0}

Streams = Mapping[str, Sequence[TurnEvent]]


# --- helpers ------------------------------------------------------------------------------


def _streams(turns: int) -> dict[str, list[TurnEvent]]:
    """``CONVERSATIONS`` synthetic conversations of ``turns`` turns, with fresh ids."""
    run = uuid.uuid4().hex[:6]
    return {
        f"outage-{run}-{i}": synthetic_turns(f"outage-{run}-{i}", turns, context_window=WINDOW, seed=i)
        for i in range(CONVERSATIONS)
    }


async def _publish_round(client: Client, streams: Streams, seq: int) -> None:
    """Publish turn ``seq`` (1-based) of every conversation."""
    for events in streams.values():
        await client.publish_turn(events[seq - 1])


async def _stored_seqs(client: Client, streams: Streams) -> dict[str, int]:
    return {cid: (await client.meta(cid)).last_seq for cid in streams}


async def _all_stored(client: Client, streams: Streams, through: int) -> bool:
    return all(seq == through for seq in (await _stored_seqs(client, streams)).values())


async def _idle(worker: Worker) -> bool:
    """No compaction running or pending: the worker has caught up."""
    return not worker.pool.tasks and await worker.pool.jobs.pending_count() == 0


async def _lagging(settings: Settings) -> dict[int, tuple[int | None, int]]:
    """Turns partitions whose committed offset (first) is short of their end (second)."""
    async with group_offsets(settings) as reader:
        partitions = sorted(reader.assignment())
        ends = await reader.end_offsets(partitions)
        committed = {tp: await reader.committed(tp) for tp in partitions}
    # An empty partition has nothing to commit: no offset counts as 0 there.
    return {tp.partition: (committed[tp], end) for tp, end in ends.items() if (committed[tp] or 0) != end}


async def _all_acknowledged(settings: Settings) -> bool:
    """Whether the worker group's committed offsets reach the end of every turns partition."""
    return not await _lagging(settings)


async def _settled(worker: Worker, client: Client, streams: Streams) -> None:
    """Wait until compactions are done and every turn acknowledged, then check the transcripts."""
    await poll_until(lambda: _idle(worker), 30, "compactions settled")
    await poll_until(
        lambda: _all_acknowledged(client.settings),
        30,
        "every turn acknowledged",
        detail=lambda: _lagging(client.settings),
    )
    await _assert_stored_exactly_once(client, streams)


async def _assert_stored_exactly_once(client: Client, streams: Streams) -> None:
    """Every turn's messages are in its transcript once, in order, and the history accounts for each."""
    for cid, events in streams.items():
        expected = [m.to_dict() for e in events for m in e.messages]
        transcript = await client.transcript(cid)
        assert [r["m"] for r in transcript] == expected, f"{cid}: transcript differs"
        assert [r["n"] for r in transcript] == list(range(1, len(expected) + 1))
        assert [r["seq"] for r in transcript] == [e.turn_seq for e in events for _ in e.messages]
        snapshot = await client.snapshot(cid)
        assert snapshot.meta.last_seq == events[-1].turn_seq
        assert coverage_problems(snapshot.history, len(expected)) == [], cid


def _compacted(done: Sequence[CompactionCompleted]) -> list[CompactionCompleted]:
    return [c for c in done if c.outcome is Outcome.COMPACTED]


class _Handled:
    """When the worker handled each turn, and how (its ``on_turn`` callback)."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[float, TurnStatus]] = []

    def __call__(self, outcome: TurnOutcome) -> None:
        self.outcomes.append((time.monotonic(), outcome.status))

    def __len__(self) -> int:
        return len(self.outcomes)

    def count(self, status: TurnStatus) -> int:
        return sum(s is status for _, s in self.outcomes)

    def first_append_after(self, moment: float) -> float | None:
        """When the first turn handled after ``moment`` was appended to its conversation."""
        return next((t for t, s in self.outcomes if t > moment and s is TurnStatus.APPENDED), None)


# --- Redis ------------------------------------------------------------------------------


async def test_redis_restart_mid_run_loses_and_duplicates_nothing(
    kafka_bootstrap: str,
    own_durable_redis: EmbeddedRedis,
    make_topics: MakeTopics,
    fake_llm: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis stops while turns stream in and comes back: every turn is stored exactly once.

    Turns keep arriving during the outage. Proves that a turn that meets a dead Redis is
    not acknowledged but delivered again until it is stored: nothing else would bring an
    acknowledged turn back, so a worker that acknowledged it would leave a hole in the
    transcript (one that does fails here). That a turn redelivered after its write had
    landed changes nothing: the transcript would show it twice (how many such turns there
    were depends on timing, so it is printed, not asserted). That compactions cut off by
    the outage leave the effective history whole and versions counting up by one, and
    that compactions commit again afterwards. And that the same worker, with the same
    Redis client, carries on once Redis is back with its data, without crashing or a
    restart, until the group's committed offsets reach the end of the topic.
    """
    caplog.set_level(logging.WARNING, logger="compaction_worker.runtime.consumer")
    turns = 45
    streams = _streams(turns)
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=PARTITIONS)
    settings = make_settings(
        kafka_bootstrap,
        own_durable_redis.url,
        topics,
        worker=WORKER,
        retry=RETRY,
        summarizer=fake_summarizer(fake_llm),
    )
    handled = _Handled()
    worker = build_worker(settings, on_turn=handled)
    published = 0
    # Slow summaries, so that the outage finds a compaction in the middle of its LLM call:
    # its commit then meets the dead Redis.
    fake_llm.set_delay(1.0)

    def refused() -> int:
        """Turn deliveries the worker could not store (and did not acknowledge)."""
        return sum(INFRA_WARNING in r.getMessage() for r in caplog.records)

    async def publish_steadily(client: Client) -> None:
        nonlocal published
        for seq in range(1, turns + 1):
            await _publish_round(client, streams, seq)
            published = seq
            await asyncio.sleep(0.1)  # a steady stream, so that turns arrive during the outage

    async with worker.running(), Client.connect(settings) as client:
        publisher = asyncio.create_task(publish_steadily(client))
        try:
            await poll_until(
                lambda: len(handled) >= 3 * CONVERSATIONS and fake_llm.in_flight > 0,
                60,
                "turns stored and a compaction waiting on its summary",
            )
            # Mid-stream: turns are being stored and a compaction is under way right now.
            await asyncio.to_thread(own_durable_redis.stop)
            stopped_at, published_at_stop = time.monotonic(), published
            # Down until the worker was refused three times (its retries failed too) and
            # fifteen more rounds of turns went to the broker meanwhile.
            await poll_until(
                lambda: refused() >= 3 and published >= published_at_stop + 15, 60, "the outage felt"
            )
            refused_during_outage = refused()
            await asyncio.to_thread(own_durable_redis.start)
            restarted_at, restarted_wall = time.monotonic(), time.time()
            fake_llm.set_delay(0)
            await publisher
        finally:
            publisher.cancel()
        await poll_until(
            lambda: _all_stored(client, streams, turns),
            60,
            "every turn stored",
            detail=lambda: _stored_seqs(client, streams),
        )
        caught_up = time.monotonic() - restarted_at
        await _settled(worker, client, streams)
        assert worker.handled >= CONVERSATIONS * turns
        started, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        for cid in streams:
            compacted = _compacted(completed[cid])
            assert {c.compaction_id for c in completed[cid]} <= {s.compaction_id for s in started[cid]}
            assert [c.version for c in compacted] == list(range(1, len(compacted) + 1))
            assert (await client.meta(cid)).version == len(compacted)
        after_restart = [
            c
            for done in completed.values()
            for c in _compacted(done)
            if c.timestamp.timestamp() > restarted_wall
        ]
        assert after_restart, "no compaction committed after Redis came back"
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []

    resumed = handled.first_append_after(restarted_at)
    assert resumed is not None
    print(
        f"\nRedis restart: down {restarted_at - stopped_at:.2f}s, {refused_during_outage} deliveries "
        f"refused meanwhile; first turn stored {resumed - restarted_at:.2f}s after Redis was back, "
        f"all {CONVERSATIONS * turns} stored after {caught_up:.2f}s; "
        f"{handled.count(TurnStatus.DUPLICATE)} redelivered turns found already stored; "
        f"{len(after_restart)} of {sum(len(_compacted(d)) for d in completed.values())} compactions "
        f"after the restart, {worker.pool.failed} compaction tasks cut off by the outage"
    )


# --- the broker ---------------------------------------------------------------------------


async def test_broker_restart_mid_run_resumes_without_loss(
    own_kafka: EmbeddedKafka, redis_url: str, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker goes away mid-compaction and comes back empty: the worker picks up where it was.

    Tansu's memory storage comes back without topics, groups or committed offsets, so the
    test recreates the topics with the same partitions right away, as provisioning would.
    The broker stops while a compaction waits on its summary and stays down until that
    compaction has committed, so its ``compaction.completed`` is published into the
    outage. Proves that the worker's consumers and producer outlive the broker: that event
    reaches the recreated topic, as does every compaction's after it (versions count up
    by one to the stored version, none missing, none twice); each consumer rejoins the
    group without a worker restart and consumes the recreated topic from its start (more
    turns follow the restart than preceded it, so a consumer that kept its old offsets
    would skip some); the new turns follow the old ones exactly once, and the turns stored
    before are untouched.

    The broker stops with no acknowledgement pending, and the producers wait until both
    consumers have rejoined. Until then a consumer still holds its offsets from before the
    restart, which on a broker that lost its log point into the new one, and aiokafka can
    commit them under the reset generation it uses between losing its membership and
    rejoining, which a broker with no members in the group accepts; turns published to
    the recreated topic in that window can then be skipped (the later ones wait in the gap
    buffer rather than being applied out of order). A broker that keeps its log, as Kafka
    does across a restart, leaves those offsets valid.
    """
    caplog.set_level(logging.INFO, logger="compaction_worker.runtime.consumer")
    turns, last_cut = 70, 25
    streams = _streams(turns)
    topics = fresh_topics()
    settings = make_settings(
        own_kafka.bootstrap_servers,
        redis_url,
        topics,
        worker=WORKER,
        retry=RETRY,
        summarizer=fake_summarizer(fake_llm),
    )
    await create_topics(own_kafka.bootstrap_servers, topics, PARTITIONS)
    handled = _Handled()
    worker = build_worker(settings, on_turn=handled)

    async def versions(client: Client) -> dict[str, int]:
        return {cid: (await client.meta(cid)).version for cid in streams}

    async def caught_up_through(seq: int) -> bool:
        return await _all_stored(client, streams, seq) and await _all_acknowledged(settings)

    def members_assigned_since(index: int) -> set[str]:
        """Consumers (by member id) that received an assignment, per the consumer's rebalance log."""
        found = (ASSIGNED.search(r.getMessage()) for r in caplog.records[index:])
        return {m.group(1) for m in found if m}

    async with worker.running(), Client.connect(settings) as client:
        # Turns until a compaction waits on its (slow) summary, each round stored and
        # acknowledged before the next: the memory storage takes unconsumed turns down with
        # it, and no commit may be pending when the broker goes (see above).
        fake_llm.set_delay(2.0)
        cut = 0
        while fake_llm.in_flight == 0:
            cut += 1
            assert cut <= last_cut, "no compaction called the summarizer"
            await _publish_round(client, streams, cut)
            await poll_until(
                functools.partial(caught_up_through, cut), 60, f"turn {cut} stored and acknowledged"
            )
        transcripts_before = {cid: await client.transcript(cid) for cid in streams}

        await asyncio.to_thread(own_kafka.stop)
        stopped_at, logs_at_stop = time.monotonic(), len(caplog.records)
        # Commits after this point report to the broker that comes back.
        at_stop = await versions(client)
        await poll_until(
            lambda: _committed_since(client, at_stop), 30, "a compaction committed during the outage"
        )
        await asyncio.to_thread(own_kafka.start)
        restarted_at = time.monotonic()
        await create_topics(own_kafka.bootstrap_servers, topics, PARTITIONS)
        fake_llm.set_delay(0)
        await poll_until(
            lambda: len(members_assigned_since(logs_at_stop)) >= settings.kafka.consumers,
            60,
            "both consumers rejoined the group",
        )
        rejoined = time.monotonic() - restarted_at

        publish_at = time.monotonic()
        for seq in range(cut + 1, turns + 1):
            await _publish_round(client, streams, seq)
        await poll_until(
            lambda: _all_stored(client, streams, turns),
            90,
            "the turns after the restart stored",
            detail=lambda: _stored_seqs(client, streams),
        )
        caught_up = time.monotonic() - publish_at
        await _settled(worker, client, streams)
        for cid, old in transcripts_before.items():
            assert (await client.transcript(cid))[: len(old)] == old, f"{cid}: stored turns changed"
        final = await versions(client)
        started, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        for cid in streams:
            reported = [c.version for c in _compacted(completed[cid])]
            assert reported, f"{cid}: no compaction published after the restart"
            assert reported == list(range(reported[0], final[cid] + 1)), f"{cid}: {reported}"
            assert reported[0] <= at_stop[cid] + 1, f"{cid}: {reported} misses commits since {at_stop[cid]}"
        # Every compaction started after the restart completed; those without a start on
        # the recreated topic began before it (their start went down with the old one).
        started_ids = {s.compaction_id for done in started.values() for s in done}
        completed_ids = {c.compaction_id for done in completed.values() for c in done}
        assert started_ids <= completed_ids
        assert completed_ids - started_ids, "the compaction cut off by the outage was not reported"
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []

    resumed = handled.first_append_after(publish_at)
    assert resumed is not None
    print(
        f"\nbroker restart: down {restarted_at - stopped_at:.2f}s (until the compaction it cut off "
        f"had committed); consumers rejoined {rejoined:.2f}s after the broker was back; first new turn "
        f"stored {resumed - publish_at:.2f}s after it was published, all {CONVERSATIONS * (turns - cut)} "
        f"after {caught_up:.2f}s"
    )


async def _committed_since(client: Client, versions: Mapping[str, int]) -> bool:
    return any([(await client.meta(cid)).version > version for cid, version in versions.items()])
