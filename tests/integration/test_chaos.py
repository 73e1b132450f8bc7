"""Worker processes on the real broker and Redis under duplicates, reordering and SIGKILL.

What these tests prove, end to end, with ``compaction-worker run`` child processes sharing
one consumer group over a 4-partition turns topic and a summarizer behind LiteLLM:

- every turn of every conversation is stored exactly once and in order, whatever the
  deliveries (each event twice, adjacent turns swapped, a turn withheld so that the rest
  of its conversation waits behind the gap) (invariants 1 and 2);
- every effective history accounts for each message once, is valid for providers and is
  under its budget, with a running token total that matches what is stored (4 and 5);
- compaction events pair up and agree with the stored versions;
- worker processes killed in the middle of LLM calls leave nothing behind: the other
  workers take over the jobs (re-marked due by redelivered or new turns, or, with no turn
  left to come, once the job leases and locks run out), and every conversation ends
  compacted under its threshold with no job left (no conversation is stuck).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from compaction_worker.budget.tokens import counter_for
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, CompactionStarted, Outcome, TurnEvent
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.settings import Settings
from compaction_worker.strategies import Draft, draft_tokens, summary_overhead
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import make_settings

from .helpers import (
    compaction_events,
    coverage_problems,
    poll_until,
    publish_many,
    read_topic,
    settle_store,
)
from .processes import WorkerProcess

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

SUMMARIZER = "openai/fake-summarizer"
WINDOW = 2048
"""Threshold 1228, target 768 tokens: a conversation of these turns compacts every ~12 turns."""
TOOL_OUTPUT_WORDS = (20, 40)
SLOTS = 4
"""Concurrent compactions per worker process."""
LOCK_TTL = 3.0
"""Seconds; a dead worker's job lease (twice this) runs out soon after its lock."""
STEADY_LOCK_TTL = 30.0
"""Seconds, where no worker dies: the default lease."""


class Spawn(Protocol):
    """Starts a named worker process on the test's settings, or on ``settings``."""

    def __call__(self, name: str, settings: Settings | None = None) -> WorkerProcess: ...


@pytest.fixture
async def chaos_settings(
    kafka_bootstrap: str, redis_url: str, make_topics: MakeTopics, fake_llm: FakeLLMServer
) -> Settings:
    """Workers' settings on fresh 4-partition topics, with the fake LLM as the summarizer."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=4)
    return make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer={"model": SUMMARIZER, "api_base": fake_llm.url, "api_key": "fake-key-0123456789"},
        worker={
            "lock_ttl_seconds": LOCK_TTL,
            "max_concurrent_compactions": SLOTS,
            "shutdown_grace_seconds": 5,
        },
    )


@pytest.fixture
def spawn(chaos_settings: Settings, tmp_path: Path) -> Iterator[Spawn]:
    """Start worker processes (logs in ``tmp_path``); any still running is killed at the end."""
    started: list[WorkerProcess] = []

    def start(name: str, settings: Settings | None = None) -> WorkerProcess:
        process = WorkerProcess(settings or chaos_settings, tmp_path, name)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.kill()


def conversation(cid: str, turns: int, seed: int) -> list[TurnEvent]:
    return synthetic_turns(cid, turns, context_window=WINDOW, seed=seed, tool_output_words=TOOL_OUTPUT_WORDS)


def records(events: Sequence[TurnEvent]) -> list[tuple[bytes, bytes]]:
    return [(e.conversation_id.encode(), e.model_dump_json(exclude_none=True).encode()) for e in events]


def interleave(streams: Sequence[Sequence[TurnEvent]]) -> list[TurnEvent]:
    """One delivery of each stream in turn, so every partition carries many conversations at once."""
    longest = max(len(s) for s in streams)
    return [s[j] for j in range(longest) for s in streams if j < len(s)]


def twice(events: Sequence[TurnEvent], pattern: int) -> list[TurnEvent]:
    """Every event delivered twice: back to back, the whole stream replayed, or trailing by three."""
    if pattern == 0:
        return [e for e in events for _ in range(2)]
    if pattern == 1:
        return [*events, *events]
    out: list[TurnEvent] = []
    for j, event in enumerate(events):
        out.append(event)
        if j >= 3:
            out.append(events[j - 3])
    return out + list(events[-3:])


async def check_conversations(
    client: Client, streams: Mapping[str, Sequence[TurnEvent]], settings: Settings
) -> dict[str, int]:
    """Assert each conversation's transcript, effective history and budget; returns its version."""
    counter = counter_for("gpt-4o-mini", settings.budget)
    overhead = summary_overhead(counter)
    versions: dict[str, int] = {}
    for cid, events in streams.items():
        # Every turn in the transcript exactly once, in order, message for message.
        transcript = await client.transcript(cid)
        expected = [m.to_dict() for e in events for m in e.messages]
        assert [r["m"] for r in transcript] == expected, cid
        assert [r["n"] for r in transcript] == list(range(1, len(expected) + 1)), cid
        assert [r["seq"] for r in transcript] == [e.turn_seq for e in events for _ in e.messages], cid

        snapshot = await client.snapshot(cid)
        meta, history = snapshot.meta, snapshot.history
        assert coverage_problems(history, len(expected)) == [], cid
        # The running total (kept incrementally) is exactly what the stored history costs,
        # and that is under the threshold: compacted where it had to be, nothing pending.
        assert meta.history_tokens == draft_tokens(Draft(history.chunks, history.entries), overhead), cid
        assert int(meta.total_tokens * meta.calibration) < meta.threshold, (cid, meta.total_tokens)
        assert await client.job(cid) is None, cid
        assert len(await client.compactions(cid)) == meta.version, cid
        versions[cid] = meta.version
    return versions


def check_events(
    started: Mapping[str, list[CompactionStarted]],
    completed: Mapping[str, list[CompactionCompleted]],
    versions: Mapping[str, int],
) -> None:
    """Assert that the completion events agree with themselves and with the stored versions."""
    for cid, version in versions.items():
        # Completion events are published at least once; a repeat has the same id.
        done = list({c.compaction_id: c for c in completed.get(cid, [])}.values())
        assert [c.error for c in done if c.outcome is Outcome.FAILED] == [], cid
        compacted = [c for c in done if c.outcome is Outcome.COMPACTED]
        assert compacted, f"{cid} was never compacted"
        assert all(c.tokens_after <= c.target < c.tokens_before for c in compacted), (
            cid,
            [
                (c.trigger, c.tokens_before, c.target, c.tokens_after, c.stages, c.notes, c.error)
                for c in compacted
                if not c.tokens_after <= c.target < c.tokens_before
            ],
        )
        # Summarized by the LLM, by the extractive fallback (when the LLM's summary failed
        # validation), or not at all (the cheap stages alone reached the target).
        assert all(
            c.summarizer_model in (SUMMARIZER, "extractive") or (c.summarizer_model is None and c.stages)
            for c in compacted
        ), [(c.stages, c.summarizer_model) for c in compacted]
        # Each committed version is reported under one id; none is reported that was not stored.
        reported = sorted(c.version for c in compacted)
        assert len(set(reported)) == len(reported), (cid, reported)
        assert set(reported) <= set(range(1, version + 1)), (cid, reported, version)
        by_id = {s.compaction_id: s for s in started.get(cid, [])}
        assert {c.compaction_id for c in done} <= set(by_id), cid
        assert all(by_id[c.compaction_id].tokens_before == c.tokens_before for c in done), cid
    llm = [c for done in completed.values() for c in done if c.summarizer_model == SUMMARIZER]
    assert any(c.outcome is Outcome.COMPACTED for c in llm), "no LLM summary was committed"


CONVERSATIONS = 120
TURNS = 16
HOLE = 5
"""The turn withheld from some conversations until the rest of them has arrived."""


@pytest.mark.slow
async def test_duplicates_and_reordering_across_two_worker_processes(
    chaos_settings: Settings, fake_llm: FakeLLMServer, spawn: Spawn
) -> None:
    """120 conversations, every turn twice, some swapped or held behind a gap: all stored once, in order, compacted.

    Two worker processes share the group. Every fourth conversation has three pairs of
    adjacent turns swapped; every tenth has turn 5 withheld until the store shows its
    turns 6..16 held (and not applied) behind the gap, then fills the gap.
    """
    settings = chaos_settings
    streams = {f"chaos-{i}": conversation(f"chaos-{i}", TURNS, seed=i) for i in range(CONVERSATIONS)}
    holed = {cid for i, cid in enumerate(streams) if i % 10 == 7}
    first_pass: list[list[TurnEvent]] = []
    withheld: list[TurnEvent] = []
    for i, (cid, events) in enumerate(streams.items()):
        order = list(events)
        if i % 4 == 1:
            for k in (2, 7, 12):  # turns 3/4, 8/9 and 13/14 arrive the wrong way round
                order[k], order[k + 1] = order[k + 1], order[k]
        deliveries = twice(order, i % 3)
        if cid in holed:
            withheld += [e for e in deliveries if e.turn_seq == HOLE]
            deliveries = [e for e in deliveries if e.turn_seq != HOLE]
        first_pass.append(deliveries)

    # No worker dies here, so nothing waits for a lock to expire: a lease as long as a deployment's
    # keeps a run whose renewals a loaded 2-core machine delays from being fenced out (a stale-fence
    # refusal is the fence doing its job, test_fencing.py, but it is not what this test is about).
    steady = settings.model_copy(
        update={"worker": settings.worker.model_copy(update={"lock_ttl_seconds": STEADY_LOCK_TTL})}
    )
    workers = [spawn(f"worker-{n}", steady) for n in range(2)]
    for worker in workers:
        await asyncio.to_thread(worker.wait_consuming)
    began = time.monotonic()
    async with Client.connect(settings) as client:
        await publish_many(client, records(interleave(first_pass)))
        gaps = client.parts.gaps

        async def held_behind_the_gap() -> bool:
            for cid in streams:
                last = (await client.meta(cid)).last_seq
                if cid in holed:
                    if last != HOLE - 1 or [h.turn_seq for h in await gaps.held_turns(cid)] != list(
                        range(HOLE + 1, TURNS + 1)
                    ):
                        return False
                elif last != TURNS:
                    return False
            return True

        took = await poll_until(held_behind_the_gap, 120, "stored up to the gaps", interval=0.5)
        print(f"\nfirst pass ({sum(map(len, first_pass))} deliveries) stored in {took:.1f}s")
        await publish_many(client, records(withheld))
        await settle_store(client, dict.fromkeys(streams, TURNS), 2 * CONVERSATIONS * TURNS)
        print(f"settled {time.monotonic() - began:.1f}s after the first publish")
        assert all(w.alive for w in workers), [w.log()[-2000:] for w in workers if not w.alive]

        versions = await check_conversations(client, streams, settings)
        started, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        check_events(started, completed, versions)
        # Nothing else happened: every compaction that started also completed.
        for cid in streams:
            assert {s.compaction_id for s in started[cid]} == {c.compaction_id for c in completed[cid]}, cid
            compacted = {c.compaction_id: c for c in completed[cid] if c.outcome is Outcome.COMPACTED}
            assert sorted(c.version for c in compacted.values()) == list(range(1, versions[cid] + 1)), cid
        assert fake_llm.requests, "the LLM summarizer was never called"
        print(f"{sum(versions.values())} compactions, {len(fake_llm.requests)} LLM calls")
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []


KILLED_CONVERSATIONS = 32
WAVES = (0, 16, 24, 32, 40)
"""Turn boundaries of the waves published between kills: each wave pushes every
conversation over its threshold again, so there are always compactions to interrupt."""
LLM_DELAY = 1.2
HANG = 120.0
"""The victims' LLM delay before the last kill: their calls hang, the survivor's do not."""


@pytest.fixture
def victim_llm() -> Iterator[FakeLLMServer]:
    """The victims' own LLM: its ``in_flight`` says whether the victim is inside a call."""
    with FakeLLMServer() as server:
        yield server


@pytest.mark.slow
async def test_workers_killed_mid_compaction_leave_no_conversation_behind(
    chaos_settings: Settings, fake_llm: FakeLLMServer, victim_llm: FakeLLMServer, spawn: Spawn
) -> None:
    """SIGKILLs in the middle of LLM calls, four times: the jobs are finished elsewhere, nothing is lost or stuck.

    A survivor runs throughout. A second worker, summarizing through an LLM of its own, is
    killed while it is inside a (slowed) call, then replaced, with a new wave of turns
    after each replacement: three rounds, where redelivered and new turns also re-mark the
    interrupted jobs due. The fourth victim is killed once every turn has been consumed
    and committed, inside calls that hang, and is not replaced: nothing but the expiry of
    its job leases and locks lets the survivor finish what it had claimed. Interrupted
    compactions show up as ``compaction.started`` events without a completion.
    """
    for llm in (fake_llm, victim_llm):
        llm.set_delay(LLM_DELAY)
    settings = chaos_settings
    victims = settings.model_copy(
        update={"summarizer": settings.summarizer.model_copy(update={"api_base": victim_llm.url})}
    )
    streams = {
        f"kill-{i}": conversation(f"kill-{i}", WAVES[-1], seed=1000 + i) for i in range(KILLED_CONVERSATIONS)
    }
    deliveries = 2 * KILLED_CONVERSATIONS * WAVES[-1]
    survivor = spawn("survivor")
    victim = spawn("victim-0", victims)
    for worker in (survivor, victim):
        await asyncio.to_thread(worker.wait_consuming)
    began = time.monotonic()
    killed_at = -math.inf
    async with Client.connect(settings) as client:

        async def publish_wave(wave: int) -> None:
            low, high = WAVES[wave], WAVES[wave + 1]
            await publish_many(client, records(interleave([twice(e[low:high], 0) for e in streams.values()])))

        async def victim_in_llm_call() -> bool:
            # A killed victim's unanswered calls count until their delay is over.
            return time.monotonic() - killed_at > LLM_DELAY + 0.5 and victim_llm.in_flight > 0

        async def kill_victim(kill: int) -> None:
            nonlocal killed_at
            await poll_until(victim_in_llm_call, 60, "the victim in an LLM call", interval=0.05)
            victim.kill()
            killed_at = time.monotonic()
            print(
                f"\nkill {kill} at {killed_at - began:.1f}s, {victim_llm.in_flight} of its LLM calls in flight"
            )

        await publish_wave(0)
        for kill in range(1, len(WAVES) - 1):
            await kill_victim(kill)
            victim = spawn(f"victim-{kill}", victims)
            await asyncio.to_thread(victim.wait_consuming)
            await publish_wave(kill)

        # The last kill: no turn is left to redeliver, and no new turn will come.
        victim_llm.set_delay(HANG)
        await settle_store(client, {}, deliveries, within=60, jobs_done=False)
        await kill_victim(len(WAVES) - 1)

        await settle_store(client, dict.fromkeys(streams, WAVES[-1]), deliveries, within=150)
        print(f"settled {time.monotonic() - began:.1f}s after the first publish")
        assert survivor.alive, survivor.log()[-3000:]

        versions = await check_conversations(client, streams, settings)
        started, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        check_events(started, completed, versions)
        # Each kill interrupted at least one compaction (its started event has no completion),
        # and every interrupted job got done: the conversation moved past the version the
        # compaction started from. A completion of the very next version is another
        # worker's redo of it (the victim could have committed just before dying, but then
        # no completion reports that version).
        done_ids = {c.compaction_id for events in completed.values() for c in events}
        orphans = [s for events in started.values() for s in events if s.compaction_id not in done_ids]
        assert len(orphans) >= len(WAVES) - 1, orphans
        assert all(versions[o.conversation_id] > o.version for o in orphans), orphans
        redone = [
            o
            for o in orphans
            if any(
                c.outcome is Outcome.COMPACTED and c.version == o.version + 1
                for c in completed[o.conversation_id]
            )
        ]
        print(
            f"{len(orphans)} compactions interrupted, {len(redone)} redone; {sum(versions.values())} committed"
        )
        assert redone, orphans
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []
