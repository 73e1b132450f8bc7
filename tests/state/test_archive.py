"""What a compaction lets go (invariant 12): ``artifacts_dropped`` counts, of what it replaced, what the
history carried verbatim before it and no longer does; summed over a conversation's events, what its
history lost, each loss once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from compaction_worker.bench.fidelity import ParaphrasingSummarizer
from compaction_worker.bench.unlisted import HELD_OUT_KINDS, KINDS, MODEL, TURNS, kinds_of, session
from compaction_worker.client.client import Client
from compaction_worker.contracts.history import STANDING, EffectiveHistory, Entry, SummaryChunk, text_of
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import Settings
from compaction_worker.state.archive import let_go, replaced_artifacts
from compaction_worker.state.connection import RedisClient
from compaction_worker.summaries.artifacts import item_core
from compaction_worker.summaries.standing import Item
from compaction_worker.testing import turn_bytes
from tests.orchestration import Published, make_parts

WINDOW = 4_096
"""Half the model's window: the identifiers outgrow what the history can hold, and some are lost."""


def _entry(n: int, text: str, role: str = "user", edit: str | None = None) -> Entry:
    return Entry(n=n, seq=n, message={"role": role, "content": text}, tokens=len(text) // 4, edit=edit)


def _chunk(last: int, artifacts: Sequence[str], text: str = "## Summary\n- (paraphrased)") -> SummaryChunk:
    return SummaryChunk(
        id=f"c{last}",
        text=text,
        first_seq=1,
        last_seq=last,
        first_n=1,
        last_n=last,
        tokens=50,
        created_at="2026-01-01T00:00:00Z",
        model="m",
        stages=("summarize",),
        artifacts=tuple(artifacts),
    )


def _history(chunks: Sequence[SummaryChunk], entries: Sequence[Entry]) -> EffectiveHistory:
    return EffectiveHistory(tuple(chunks), tuple(entries))


class TestLetGo:
    """The count is of items carried before and not after, one per identifier."""

    def test_what_the_new_history_still_carries_is_not_lost(self) -> None:
        """Summarized turns whose identifiers the new chunk's ledger keeps lose nothing; the others are counted."""
        before = _history(
            (),
            [
                _entry(1, "The contact is ana.kovacs@ledgerly.example now."),
                _entry(2, "We set MAX_POOL_SIZE_18=64 there."),
            ],
        )
        after = _history([_chunk(2, ["term: ana.kovacs@ledgerly.example"])], [])
        items = [a.item for a in replaced_artifacts(before, after.chunks, after.entries, {})]
        assert let_go(items, before, after) == [
            "term: MAX_POOL_SIZE_18=64 \u2014 We set MAX_POOL_SIZE_18=64 there."
        ]

    def test_an_item_lost_before_is_not_lost_again(self) -> None:
        """A fold replaces a chunk whose ledger had already lost an identifier: that loss was counted then."""
        first = _entry(1, "The image is registry.acme.io/team/app:1.4.2 today.")
        earlier = _history([_chunk(1, [])], [_entry(2, "ok")])
        items = [a.item for a in replaced_artifacts(earlier, (), (), {1: first.message})]
        # Entry 2 says nothing; the folded chunk carried nothing: nothing to lose.
        assert let_go(items, earlier, _history([_chunk(2, [])], [])) == []
        # The original of an edited entry is read for the archive, but only what the history showed counts.
        pruned = _entry(1, "[output cleared]", role="tool", edit="pruned")
        before = _history((), [pruned])
        items = [a.item for a in replaced_artifacts(before, (), (), {1: first.message})]
        assert items
        assert let_go(items, before, _history([_chunk(1, [])], [])) == []

    def test_one_identifier_in_several_places_is_one_loss(self) -> None:
        """The same term said twice, with other words around it, is two items and one loss."""
        before = _history(
            (),
            [
                _entry(1, "The channel is #ledger-alerts for this."),
                _entry(2, "Post it to #ledger-alerts again please."),
            ],
        )
        after = _history([_chunk(2, [])], [])
        items = [a.item for a in replaced_artifacts(before, after.chunks, after.entries, {})]
        assert len([i for i in items if "#ledger-alerts" in i]) == 2
        assert len(let_go(items, before, after)) == 1

    def test_what_the_standing_state_no_longer_shows_is_lost(self) -> None:
        """A sentence the standing state showed and the new state leaves out is let go; one it still shows is not."""
        old = Item("fact", "We set MAX_POOL_SIZE_30=32 in the environment.", 9, 9, superseded_by=85)
        new = Item("fact", "We set RETRY_BUDGET_8=8 in the environment.", 85, 85)

        def state(shown: Sequence[str]) -> Entry:
            message: Mapping[str, Any] = {
                "role": "user",
                "content": "[Standing state]\n" + "\n".join(f"- [turn 9] {s}" for s in shown),
                "standing_state": {"items": [old.to_data(), new.to_data()]},
            }
            return Entry(n=0, seq=90, message=message, tokens=40, edit=STANDING)

        chunk = _chunk(90, [])
        before = _history([chunk], [state([old.text, new.text])])
        after = _history([chunk], [state([new.text])])
        items = [a.item for a in replaced_artifacts(before, after.chunks, after.entries, {})]
        lost = let_go(items, before, after)
        # The state's labels ("turn 9") and headings are no one's words: they are not counted.
        assert [item_core(i) for i in lost] == ["MAX_POOL_SIZE_30=32"]


def _shown(messages: Sequence[Mapping[str, Any]]) -> str:
    """What a model reads: every message's text and its tool calls' arguments, decoded (the test's own reading)."""
    out = []
    for message in messages:
        out.append(text_of(message))
        for call in message.get("tool_calls") or ():
            out.extend(str(v) for v in json.loads(call["function"]["arguments"]).values())
    return "\n".join(out)


@pytest.mark.integration
@pytest.mark.parametrize(("seed", "held_out"), [(11, False), (2718, True), (4099, False)])
async def test_artifacts_dropped_is_what_the_history_lost(
    redis_client: RedisClient, settings: Settings, published: Published, seed: int, held_out: bool
) -> None:
    """Generated conversations (kinds no list names in prose, tools naming paths, ids, hosts and URLs),
    one turn at a time, compacted when due by a summarizer that keeps nothing: the events' counts sum to
    the identifiers the history actually lost (held verbatim before a compaction, not after), within 10%.

    The loss is counted here from the generator's own identifiers and a plain substring search of
    ``Client.messages``, not from the extractors. Before, an event counted every archived item the history
    lacked, lost by any compaction so far: the sum was several times the loss."""
    kinds = kinds_of(seed, HELD_OUT_KINDS if held_out else KINDS, held_out=held_out)
    generated = session(seed, kinds, TURNS, every=TURNS // HELD_OUT_KINDS if held_out else 2, noise=(0, 2))
    identifiers = [p.text for p in generated.planted] + list(generated.noise)
    parts = make_parts(redis_client, settings, published, lambda _m, _c: [ParaphrasingSummarizer()])
    client = Client(settings, parts.store, None)
    cid = f"generated-{seed}"
    reported, lost, compactions = 0, 0, 0
    for seq, messages in generated.turns:
        await parts.turns.handle(turn_bytes(cid, seq, messages, MODEL, context_window=WINDOW), cid.encode())
        before = _shown(await client.messages(cid))
        done = await run_job(parts.jobs, parts.compactor, cid)
        if done is None:
            continue
        after = _shown(await client.messages(cid))
        compactions += 1
        lost_now = sum(1 for i in identifiers if i in before and i not in after)
        assert abs(done.artifacts_dropped - lost_now) <= max(1, lost_now // 10), (
            seq,
            done.artifacts_dropped,
            lost_now,
        )
        reported += done.artifacts_dropped
        lost += lost_now
    assert compactions >= 10
    assert lost > 0
    assert abs(reported - lost) <= lost / 10, (reported, lost)
