"""Runs (runtime/runs.py): consecutive turns of one conversation stored by one script call.

A run must store exactly what the per-turn path stores, cost one script call, and leave to the
per-turn path every turn that is not a plain append of the meta the handler knows (a
redelivery, a gap, a meta another writer changed), writing nothing for it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from aiokafka import ConsumerRecord, TopicPartition
from faststream.kafka import TestKafkaBroker

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.conversation import decide as plan
from compaction_worker.conversation.apply import Appends
from compaction_worker.observability import tracing
from compaction_worker.runtime import runs
from compaction_worker.runtime.consumer import handle_batch
from compaction_worker.runtime.runs import append_run
from compaction_worker.runtime.turns import TurnOutcome, TurnStatus
from compaction_worker.runtime.worker import build_worker
from compaction_worker.state.store import Store
from compaction_worker.testing import turn_bytes
from tests.observability.memory import memory
from tests.orchestration import Parts, Published, assistant, make_parts, make_settings, user

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def turn(cid: str, seq: int) -> bytes:
    """A turn with what the plan reads: a system prompt and tools on the first, usage on the even ones."""
    fields: dict[str, Any] = {"system_prompt": "Be brief.", "tools": TOOLS} if seq == 1 else {}
    if seq % 2 == 0:
        fields["usage"] = {"prompt_tokens": 40 * seq, "completion_tokens": 5}
    return turn_bytes(cid, seq, [user(f"question {seq} " * 5), assistant(f"answer {seq}")], **fields)


def items(cid: str, seqs: Sequence[int]) -> list[tuple[bytes, bytes | None]]:
    return [(turn(cid, seq), cid.encode()) for seq in seqs]


def script_calls(monkeypatch: pytest.MonkeyPatch, appends: Appends) -> Counter[str]:
    """Counts the per-turn script's calls ``appends`` makes: ``_turn`` for a single turn's, ``_run``
    for a run's (a call of several turns)."""
    calls: Counter[str] = Counter()
    script = appends._script

    async def counted(keys: Any, args: Any) -> Any:
        calls["_turn" if args[0] == "1" else "_run"] += 1
        return await script(keys, args)

    monkeypatch.setattr(appends, "_script", counted)
    return calls


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def stored(redis_client: redis.asyncio.Redis, store: Store, cid: str) -> dict[str, Any]:
    """What is stored for a conversation, less what differs by conversation id or by clock."""
    keys = store.keys(cid)
    meta = {_text(k): _text(v) for k, v in (await redis_client.hgetall(keys.meta)).items()}
    clock = {"updated_at", "created_at", "expires_at"}
    records = [json.loads(r) for r in await redis_client.lrange(keys.transcript, 0, -1)]
    entries = [json.loads(r) for r in await redis_client.lrange(keys.entries, 0, -1)]
    for record in (*records, *entries):
        record.pop("at", None)
    return {
        "meta": {k: v for k, v in meta.items() if k not in clock},
        "transcript": records,
        "entries": entries,
        "fingerprints": sorted((await redis_client.hgetall(keys.fingerprints)).keys()),
    }


class TestRuns:
    async def test_a_run_stores_what_the_turns_one_by_one_store(
        self, parts: Parts, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Meta, transcript, entries and fingerprints alike; five turns in one script call."""
        for raw, key in items("c", range(1, 6)):
            assert (await parts.turns.handle(raw, key)).status is TurnStatus.APPENDED
        calls = script_calls(monkeypatch, parts.appends)

        outcomes = await append_run(parts.turns, items("d", range(1, 6)))

        assert [(o.status, o.last_seq) for o in outcomes] == [(TurnStatus.APPENDED, s) for s in range(1, 6)]
        assert calls == {"_run": 1}
        assert await stored(redis_client, parts.store, "d") == await stored(redis_client, parts.store, "c")
        assert (await parts.store.meta("d")).rev == 5

    async def test_a_run_gives_every_key_the_deadline_its_meta_keeps(
        self, redis_client: redis.asyncio.Redis, published: Published
    ) -> None:
        """A new conversation's run creates its keys and gives each the one deadline (lua/expiry.lua),
        as turns stored one by one do: an expiry set before a key exists would be lost."""
        parts = make_parts(redis_client, make_settings(redis={"retention_seconds": 3600}), published)
        for raw, key in items("c", range(1, 4)):
            await parts.turns.handle(raw, key)
        await append_run(parts.turns, items("d", range(1, 4)))

        for cid in ("c", "d"):
            keys = parts.store.keys(cid)
            deadline = int(await redis_client.hget(keys.meta, "expires_at") or 0)
            assert deadline > 0
            for name in (keys.meta, keys.transcript, keys.fingerprints):
                assert await redis_client.pexpiretime(name) == deadline, (cid, name)

    async def test_a_run_writes_each_list_and_hash_once(
        self, parts: Parts, redis_client: redis.asyncio.Redis
    ) -> None:
        """Five turns of a known conversation in one call: one RPUSH of the transcript (the only list
        an append writes), one HSET of the meta and one of the fingerprints, the meta read once;
        with no turn held, nothing else is read."""
        await parts.turns.handle(*items("c", [1])[0])
        await redis_client.config_resetstat()

        outcomes = await append_run(parts.turns, items("c", range(2, 7)))

        assert [o.last_seq for o in outcomes] == [2, 3, 4, 5, 6]
        stats = await redis_client.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
        inside = {name: calls.get(name, 0) for name in ("rpush", "hset", "hmget", "pexpireat", "hget")}
        assert inside == {"rpush": 1, "hset": 2, "hmget": 1, "pexpireat": 0, "hget": 0}

    async def test_traced_a_run_still_stores_in_one_call_and_each_turn_keeps_its_span(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Issue 34: telemetry does not change how Redis is written. Each turn's own span is current
        while it is planned, so the request it carries continues its trace."""
        monkeypatch.undo()  # the real `enabled`: the SDK provider installed below
        calls = script_calls(monkeypatch, parts.appends)
        forced = turn_bytes("c", 3, [user("compact now")], compaction={"mode": "force"})
        records = [*items("c", range(1, 3)), (forced, b"c")]
        with memory().recording() as telemetry:
            spans = [tracing.started_consume_span(
                topic="turns", partition=0, offset=i, group="g", conversation_id="c", headers=None
            ) for i in range(3)]  # fmt: skip
            outcomes = await append_run(parts.turns, records, spans.__getitem__)
            finished = telemetry.named("turns process")

        assert [o.status for o in outcomes] == [TurnStatus.APPENDED] * 3
        assert calls == Counter({"_run": 1})
        assert [s.attributes["compaction.append.run"] for s in finished] == [3, 3, 3]  # type: ignore[index]
        parent = tracing.context_of(await parts.jobs.traceparent("c"))
        assert parent is not None
        assert tracing.get_span_context(parent).span_id == spans[2].get_span_context().span_id

    async def test_a_run_continues_the_meta_the_handler_knows(
        self, parts: Parts, redis_client: redis.asyncio.Redis
    ) -> None:
        """After turns stored one by one, a run appends the next ones on top, as they would be."""
        for raw, key in items("c", range(1, 7)):
            await parts.turns.handle(raw, key)
        for raw, key in items("d", range(1, 3)):
            await parts.turns.handle(raw, key)

        outcomes = await append_run(parts.turns, items("d", range(3, 7)))

        assert [o.last_seq for o in outcomes] == [3, 4, 5, 6]
        assert await stored(redis_client, parts.store, "d") == await stored(redis_client, parts.store, "c")

    async def test_a_turn_that_is_not_the_next_is_left_to_the_per_turn_path(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A redelivery or a turn ahead of a gap: no run is sent; a gap inside the records ends the run before it."""
        for raw, key in items("c", range(1, 3)):
            await parts.turns.handle(raw, key)
        calls = script_calls(monkeypatch, parts.appends)

        assert await append_run(parts.turns, items("c", [2, 3])) == []  # 2 is stored: a duplicate
        assert await append_run(parts.turns, items("c", [4, 5])) == []  # 3 is missing: a gap
        assert calls == {}
        outcomes = await append_run(parts.turns, items("c", [3, 4, 6]))
        assert [o.last_seq for o in outcomes] == [3, 4]
        assert (await parts.store.meta("c")).last_seq == 4

    async def test_a_run_is_bounded_in_turns_and_bytes(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """RUN_MAX turns at most; a turn that would take a run over RUN_MAX_BYTES starts the next."""
        monkeypatch.setattr(runs, "RUN_MAX", 3)
        assert [o.last_seq for o in await append_run(parts.turns, items("c", range(1, 6)))] == [1, 2, 3]
        records = items("c", range(4, 8))
        monkeypatch.setattr(runs, "RUN_MAX_BYTES", len(records[0][0]) + len(records[1][0]))
        assert [o.last_seq for o in await append_run(parts.turns, records)] == [4, 5]

    async def test_a_meta_changed_by_another_writer_gets_no_write(
        self, parts: Parts, settings: Any, published: Any, redis_client: redis.asyncio.Redis
    ) -> None:
        """Another worker stored the next turn, or changed the meta: the run writes nothing; the
        per-turn path then reads the meta and stores (or recognises) each turn."""
        for raw, key in items("c", range(1, 3)):
            await parts.turns.handle(raw, key)
        other = make_parts(redis_client, settings, published)
        await other.turns.handle(*items("c", [3])[0])

        assert await append_run(parts.turns, items("c", [3, 4])) == []
        assert (await parts.store.meta("c")).last_seq == 3

        for raw, key in items("c", [3, 4, 5]):
            await parts.turns.handle(raw, key)
        meta = await parts.store.meta("c")
        assert (meta.last_seq, meta.msg_count) == (5, 10)

        for raw, key in items("d", [1, 2]):
            await parts.turns.handle(raw, key)
        await redis_client.hincrby(parts.store.keys("d").meta, "rev", 1)  # a writer that changes the meta
        assert await append_run(parts.turns, items("d", [3, 4])) == []
        assert (await parts.store.meta("d")).last_seq == 2
        outcomes = [await parts.turns.handle(raw, key) for raw, key in items("d", [3, 4])]
        assert [o.status for o in outcomes] == [TurnStatus.APPENDED] * 2
        assert await append_run(parts.turns, items("d", [5, 6])) != []  # the meta read meanwhile is known

    async def test_a_run_stops_after_a_turn_whose_next_is_held(self, parts: Parts) -> None:
        """Turn 3 arrived first and is held: the run appends 1 and 2, stops, and the held turn applies then."""
        held = await parts.turns.handle(*items("c", [3])[0])
        assert held.status is TurnStatus.BUFFERED

        outcomes = await append_run(parts.turns, items("c", [1, 2, 3, 4]))

        assert [(o.last_seq, o.next_held) for o in outcomes] == [(1, False), (2, True)]
        assert (await parts.store.meta("c")).last_seq == 3
        assert await parts.gaps.held_turns("c") == []
        assert await parts.gaps.held_count() == 0

    async def test_a_failing_run_is_left_to_the_per_turn_path_and_an_outage_propagates(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bug in a run costs its turns the per-turn path (bounded tries, the DLQ), never a lost turn."""

        async def broken(*_: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(parts.appends, "apply", broken)
        assert await append_run(parts.turns, items("c", [1, 2])) == []

        async def down(*_: object) -> None:
            raise redis.exceptions.ConnectionError("Redis is away")

        monkeypatch.setattr(parts.appends, "apply", down)
        with pytest.raises(redis.exceptions.ConnectionError):
            await append_run(parts.turns, items("c", [1, 2]))
        assert (await parts.store.meta("c")).last_seq == 0

    async def test_a_turn_whose_planning_fails_ends_the_run_as_its_first_try(
        self, redis_client: redis.asyncio.Redis, published: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The turns before it are stored; the per-turn path makes its other tries, then dead-letters it."""
        settings = make_settings(retry={"base_seconds": 0.01, "cap_seconds": 0.02, "turn_attempts": 3})
        parts = make_parts(redis_client, settings, published)
        tries = 0
        real = plan.plan_append

        def failing(event: TurnEvent, *args: Any, **kwargs: Any) -> Any:
            nonlocal tries
            if event.turn_seq == 3:
                tries += 1
                raise ZeroDivisionError("a bug turn 3 triggers")
            return real(event, *args, **kwargs)

        monkeypatch.setattr(plan, "plan_append", failing)
        records = items("c", [1, 2, 3, 4])

        assert [o.last_seq for o in await append_run(parts.turns, records)] == [1, 2]
        assert tries == 1
        poisoned = await parts.turns.handle(*records[2])
        assert (poisoned.status, poisoned.reason, tries) == (TurnStatus.DEAD_LETTERED, "processing_failed", 3)
        assert parts.turns.failed_in_run == {}
        assert (await parts.store.meta("c")).last_seq == 2


class TestWorkerRuns:
    """The worker hands each conversation's records of a batch to runs, the rest to the per-turn path."""

    async def test_a_batch_mixing_runs_duplicates_gaps_and_bad_input(
        self, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        settings = make_settings(kafka={"bootstrap_servers": "in-process:9092"})
        outcomes: list[TurnOutcome] = []
        worker = build_worker(settings, redis_client=redis_client, on_turn=outcomes.append)
        calls = script_calls(monkeypatch, worker.turns.appends)
        seqs = [1, 2, 3, 3, 4, 6, 7, 5, 8]
        values = [turn("c", s) for s in seqs]
        values.insert(5, b"{not json")
        topic = settings.topics.turns
        tp = TopicPartition(topic, 0)
        batch = {
            tp: [
                ConsumerRecord(topic, 0, offset, 0, 0, b"c", value, None, 1, len(value), [])
                for offset, value in enumerate(values)
            ]
        }
        async with TestKafkaBroker(worker.broker):
            result = await handle_batch(
                batch, worker.consumer.handle, asyncio.Semaphore(4), worker.consumer.handle_run
            )

        assert (result.commits, result.rewinds, result.handled) == ({tp: len(values)}, {}, len(values))
        assert [o.status.value for o in outcomes] == [
            *["appended"] * 3,  # one run
            "duplicate",
            "appended",
            "dead_lettered",
            *["buffered"] * 2,  # 6 and 7 wait for 5
            "appended",  # 5, then 6 and 7 drained
            "appended",  # 8
        ]
        assert worker.handled == len(values)
        meta = await worker.store.meta("c")
        assert (meta.last_seq, meta.msg_count) == (8, 16)
        assert calls["_run"] == 1
