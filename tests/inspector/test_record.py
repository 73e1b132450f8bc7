"""The compaction log record the commit script completes: the turn, the total after, the event."""

from __future__ import annotations

import pytest

from compaction_worker.contracts.events import CompactionCompleted
from compaction_worker.inspector.sawtooth import series
from compaction_worker.runtime.turns import TurnHandler
from tests.orchestration import Parts, compact_now, conversation

pytestmark = pytest.mark.integration


async def hand_until_scheduled(turns: TurnHandler, events: list[bytes]) -> int:
    for i, event in enumerate(events, start=1):
        if (await turns.handle(event, b"c")).scheduled is not None:
            return i
    raise AssertionError("no turn crossed the threshold")


async def test_each_commit_and_rewind_records_its_turn_total_and_event(parts: Parts) -> None:
    events = conversation(80)
    handed = await hand_until_scheduled(parts.turns, events)
    done = await compact_now(parts.jobs, parts.compactor)
    meta = await parts.store.meta("c")

    (record,) = await parts.store.compactions("c")
    assert int(record["last_seq"]) == meta.last_seq == handed
    assert int(record["history_tokens"]) == meta.history_tokens
    assert CompactionCompleted.model_validate(record["completed"]) == done
    assert record["version"] == 1
    assert record["chunks_before"] == []

    for event in events[handed : handed + 3]:
        await parts.turns.handle(event, b"c")
    await parts.rewinder.rewind("c")
    rewind = (await parts.store.compactions("c"))[-1]
    after = await parts.store.meta("c")
    assert rewind["trigger"] == "rewind"
    assert "completed" not in rewind
    assert (int(rewind["last_seq"]), int(rewind["history_tokens"])) == (handed + 3, after.history_tokens)


async def test_the_sawtooth_rebuilt_from_the_records_ends_at_the_stored_total(parts: Parts) -> None:
    """Per-message counts plus each commit's total give exactly the meta's running total, turn by turn."""
    events = conversation(120)
    handed = 0
    totals: dict[int, int] = {}
    for _ in range(3):
        handed += await hand_until_scheduled(parts.turns, events[handed:])
        await compact_now(parts.jobs, parts.compactor)
        handed += 1
        await parts.turns.handle(events[handed - 1], b"c")
        meta = await parts.store.meta("c")
        totals[meta.last_seq] = meta.total_tokens
    drawn = series(
        await parts.store.transcript("c"),
        await parts.store.compactions("c"),
        fixed=meta.fixed_tokens,
        scale=1.0,
    )
    assert len(drawn.markers) == 3
    last_point = dict(zip(drawn.seqs, drawn.tokens, strict=True))
    assert {seq: last_point[seq] for seq in totals} == totals
