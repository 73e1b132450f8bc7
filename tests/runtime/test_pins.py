"""Tests for pinning a message after the fact (compaction_worker.runtime.pins), through a real Redis."""

from __future__ import annotations

from collections import Counter

import pytest
import redis.asyncio

from compaction_worker.budget.tokens import TokenCounter
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.contracts.history import render
from compaction_worker.errors import LockNotAcquiredError, PinError
from compaction_worker.local.embedded import EmbeddedRedis
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import Settings
from compaction_worker.state.lock import Lease
from compaction_worker.state.refusals import not_applied_of
from compaction_worker.summaries.contract import Summarizer, SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, assistant, compactor_with, make_parts, user

pytestmark = pytest.mark.integration

NOTE = "Deployed build 7731 to staging; the rollback command is in runbook section 4."
"""An assistant message: not the user's words, so nothing but a pin keeps it verbatim."""


class Down:
    """An LLM summarizer in an outage: every call fails (the extractive fallback writes)."""

    name = "openai/down"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise SummarizerError("connection refused")


def outage(_model: str, counter: TokenCounter) -> list[Summarizer]:
    return [Down(), ExtractiveSummarizer(counter.text)]


async def turns(parts: Parts, first: int, last: int) -> None:
    for seq in range(first, last + 1):
        message = (
            user(f"question {seq}: " + "detail " * 60)
            if seq % 2
            else assistant(f"answer {seq}: " + "so " * 60)
        )
        await parts.turns.handle(turn_bytes("c", seq, [message]), b"c")


async def compact(parts: Parts, published: Published, *, fallback: bool = False) -> CompactionCompleted:
    compactor = compactor_with(parts, published, outage) if fallback else parts.compactor
    await parts.jobs.schedule("c", Trigger.MANUAL)
    done = await run_job(parts.jobs, compactor, "c")
    assert done is not None
    return done


def rendered_texts(parts_history: list[dict[str, object]]) -> list[object]:
    return [m.get("content") for m in parts_history]


async def test_a_message_pinned_later_is_verbatim_after_five_compactions_one_a_fallback(
    parts: Parts, settings: Settings, published: Published
) -> None:
    """Issue 37: `Client.pin` at turn 3 (after it was published unpinned) keeps it verbatim through
    five manual compactions, the third written by the fallback during an LLM outage."""
    await turns(parts, 1, 2)
    await parts.turns.handle(turn_bytes("c", 3, [assistant(NOTE)]), b"c")
    await turns(parts, 4, 20)
    client = Client(settings, parts.store, None)

    assert await client.pin("c", 3) == [3]
    for round_ in range(5):  # without the pin, the first round summarizes it (the unpin test)
        done = await compact(parts, published, fallback=round_ == 2)
        history = (await parts.store.snapshot("c")).history
        messages = render(history, settings.pipeline.summary_placement)

        assert done.outcome is Outcome.COMPACTED, done.error
        assert NOTE in rendered_texts(messages), f"round {round_ + 1}"
        if round_ == 2:
            assert done.summarizer_model == "extractive"
        await turns(parts, 21 + 10 * round_, 30 + 10 * round_)


async def test_unpinned_it_compacts_as_any_other_message(
    parts: Parts, settings: Settings, published: Published
) -> None:
    await turns(parts, 1, 2)
    await parts.turns.handle(turn_bytes("c", 3, [{**assistant(NOTE), "pinned": True}]), b"c")
    await turns(parts, 4, 20)
    client = Client(settings, parts.store, None)

    assert await client.unpin("c", 3, index=0) == [3]
    await compact(parts, published)
    messages = render((await parts.store.snapshot("c")).history, settings.pipeline.summary_placement)

    assert NOTE not in rendered_texts(messages)


async def test_what_cannot_be_pinned_is_refused_with_the_reason(
    parts: Parts, settings: Settings, published: Published
) -> None:
    await turns(parts, 1, 20)
    client = Client(settings, parts.store, None)
    await compact(parts, published)

    with pytest.raises(PinError, match="has no turn 99"):
        await client.pin("c", 99)
    with pytest.raises(PinError, match="1 messages, no index 2"):
        await client.pin("c", 4, index=2)
    with pytest.raises(PinError, match="already summarized"):
        await client.pin("c", 4)
    held = await parts.locks.acquire("c", parts.store.keys("c"))
    assert isinstance(held, Lease)
    with pytest.raises(LockNotAcquiredError):
        await client.pin("c", 20)


async def test_a_turns_pin_field_pins_as_the_client_does(
    parts: Parts, settings: Settings, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime that only publishes: turn 21 pins turn 3 (and names a turn that is not there); the
    pins are stored with the append, the next compaction applies them first (the one that names no
    turn is logged and dropped), and keeps the pinned message."""
    await turns(parts, 1, 2)
    await parts.turns.handle(turn_bytes("c", 3, [assistant(NOTE)]), b"c")
    await turns(parts, 4, 20)
    asked = [{"turn_seq": 3}, {"turn_seq": 99}]
    await parts.turns.handle(turn_bytes("c", 21, [user("pin that deploy note")], pin=asked), b"c")

    assert (await parts.store.meta("c")).pins == "[[3,null,true,21],[99,null,true,21]]"
    assert "has no turn 99" not in caplog.text
    await compact(parts, published)
    assert "has no turn 99" in caplog.text
    assert (await parts.store.meta("c")).pins == ""
    # Turn 21 hears of it where its runtime reads it (state/refusals.py; Client.wait_for reports it).
    (problem,) = not_applied_of(await parts.store.redis.hget(parts.store.keys("c").refused, "21:asks"))
    assert problem.startswith("pin of turn 99: c has no turn 99")
    messages = render((await parts.store.snapshot("c")).history, settings.pipeline.summary_placement)
    assert NOTE in rendered_texts(messages)


async def test_a_pin_asked_during_a_compaction_is_applied_by_the_next_one(
    parts: Parts, settings: Settings, published: Published
) -> None:
    """The lock is held when the pin arrives: it waits in the meta, and the next compaction applies it
    before it reads the history; an unpin the same way."""
    await turns(parts, 1, 2)
    await parts.turns.handle(turn_bytes("c", 3, [assistant(NOTE)]), b"c")
    await turns(parts, 4, 20)
    held = await parts.locks.acquire("c", parts.store.keys("c"))
    assert isinstance(held, Lease)
    await parts.turns.handle(
        turn_bytes("c", 21, [user("keep that note")], pin=[{"turn_seq": 3, "index": 0}]), b"c"
    )
    assert (await parts.store.meta("c")).pins == "[[3,0,true,21]]"
    await parts.locks.release(held, parts.store.keys("c"))

    await compact(parts, published)
    snapshot = await parts.store.snapshot("c")
    assert snapshot.meta.pins == ""
    assert NOTE in rendered_texts(render(snapshot.history, settings.pipeline.summary_placement))


async def test_a_message_appended_since_the_last_compaction_is_pinned_where_it_is(
    parts: Parts, settings: Settings, published: Published
) -> None:
    """Turns appended after a compaction are read from the transcript (store.py): pinning one moves
    the records up to it into the entries list, flagged, and the history reads the same otherwise."""
    await turns(parts, 1, 20)
    await compact(parts, published)
    await turns(parts, 21, 24)
    keys = parts.store.keys("c")
    snapshot = await parts.store.snapshot("c")
    before, tail = snapshot.history.entries, snapshot.meta.tail
    listed = await parts.store.redis.llen(keys.entries)

    assert len(await Client(settings, parts.store, None).pin("c", 22)) == 1
    after = (await parts.store.snapshot("c")).history.entries

    assert [e.n for e in after] == [e.n for e in before]
    assert [e.n for e in after if e.message.get("pinned")] == [e.n for e in before if e.seq == 22]
    assert [{**e.message, "pinned": False} for e in after] == [{**e.message, "pinned": False} for e in before]
    (pinned,) = [e.n for e in before if e.seq == 22]
    assert pinned > tail  # it was the transcript's: the records up to it moved
    assert await parts.store.redis.llen(keys.entries) == listed + pinned - tail
    assert (await parts.store.meta("c")).tail == pinned == after[-3].n  # 23 and 24 are still the transcript's


async def test_a_pin_asked_on_a_turn_costs_the_consumer_path_o1_redis_commands(
    own_redis: EmbeddedRedis, settings: Settings, published: Published
) -> None:
    """The Redis commands a pin-asking turn costs the consumer path, counted by the server
    (``INFO commandstats``, the script's own commands included), are the same after 4 turns and
    after 300: the pin is stored with the turn; no lock is taken and no transcript is read."""
    client = redis.asyncio.Redis.from_url(own_redis.url)
    parts = make_parts(client, settings, published)
    costs = []
    try:
        for cid, history in (("short", 4), ("long", 300)):
            for seq in range(1, history + 1):
                await parts.turns.handle(turn_bytes(cid, seq, [user(f"q{seq}")]), cid.encode())
            await client.config_resetstat()
            pin = turn_bytes(cid, history + 1, [user("keep turn 2")], pin=[{"turn_seq": 2}])
            await parts.turns.handle(pin, cid.encode())
            stats = await client.info("commandstats")
            costs.append(Counter({name: int(stat["calls"]) for name, stat in stats.items()}))
            assert (await parts.store.meta(cid)).pins == f"[[2,null,true,{history + 1}]]"
    finally:
        await client.aclose()
    short, long = costs
    assert short == long
    assert not {"cmdstat_lrange", "cmdstat_lindex", "cmdstat_set"} & set(long)  # no read, no lock
    assert sum(long.values()) - long["cmdstat_info"] <= 8, long


async def test_a_client_pin_applies_the_pins_turns_asked_first(
    parts: Parts, settings: Settings, published: Published
) -> None:
    """A ``Client.pin`` caller holds the lock: the pins turns asked for are applied then too."""
    await turns(parts, 1, 2)
    await parts.turns.handle(turn_bytes("c", 3, [assistant(NOTE)]), b"c")
    await turns(parts, 4, 6)
    await parts.turns.handle(turn_bytes("c", 7, [user("keep the note")], pin=[{"turn_seq": 3}]), b"c")
    await Client(settings, parts.store, None).pin("c", 6)

    snapshot = await parts.store.snapshot("c")
    assert snapshot.meta.pins == ""
    assert {e.seq for e in snapshot.history.entries if e.message.get("pinned")} == {3, 6}
