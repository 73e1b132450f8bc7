"""The client's reading side: the messages a runtime sends are rendered with the configured placement."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import redis.asyncio

from compaction_worker.budget.attachments import file_budget, fit_files
from compaction_worker.budget.tokens import counter_for
from compaction_worker.client.client import Client
from compaction_worker.contracts.history import (
    SUMMARY_ACK,
    SUMMARY_HEADER,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    text_of,
)
from compaction_worker.conversation.meta import Meta
from compaction_worker.errors import ConversationNotFound
from compaction_worker.settings import Settings
from compaction_worker.state.store import Snapshot, Store
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, user
from tests.runtime.test_compactor import compact_mentions

HISTORY = EffectiveHistory(
    chunks=(SummaryChunk("c", "earlier work", 1, 2, 1, 2, 4, "2024-01-01T00:00:00+00:00", "fake"),),
    entries=(Entry(n=3, seq=3, message={"role": "user", "content": "and now?"}, tokens=6),),
)


class OneSnapshot:
    """Stands in for the store: always the same snapshot."""

    async def snapshot(self, conversation_id: str) -> Snapshot:
        return Snapshot(Meta(last_seq=3), HISTORY)


def client(placement: str) -> Client:
    settings = Settings.model_validate({"pipeline": {"summary_placement": placement}})
    return Client(settings, cast(Store, OneSnapshot()), None)


async def test_separate_placement() -> None:
    """The default: the summary as its own user turn and an acknowledgment (reference 000)."""
    messages: list[dict[str, Any]] = await client("separate").messages("c1")
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == SUMMARY_ACK


async def test_merge_placement() -> None:
    """Configured to merge, the summary joins the first kept user message (reference 001)."""
    messages = await client("merge").messages("c1")
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith(SUMMARY_HEADER)
    assert messages[0]["content"].endswith("\n\nand now?")


async def test_a_profile_s_placement() -> None:
    """A conversation of a profile that merges is rendered merged, whatever the deployment's placement."""
    settings = Settings.model_validate(
        {"profiles": {"merging": {"pipeline": {"summary_placement": "merge"}}}}
    )

    class Profiled:
        async def snapshot(self, conversation_id: str) -> Snapshot:
            return Snapshot(Meta(last_seq=3, profile="merging"), HISTORY)

    messages = await Client(settings, cast(Store, Profiled()), None).messages("c1")
    assert settings.pipeline.summary_placement == "separate"
    assert [m["role"] for m in messages] == ["user"]


def test_placement_is_validated() -> None:
    """Only the two placements exist."""
    with pytest.raises(ValueError, match="summary_placement"):
        client("system")


FILES = {"notes.md": "short notes", "report.txt": "a line of the quarterly report\n" * 2_000}


@pytest.mark.integration
async def test_fit_files_to_the_conversation_budget(parts: Parts, settings: Settings) -> None:
    """Reference 004 (file token budget): files get 60% of what the window has left, counted for its model."""
    await parts.turns.handle(
        turn_bytes("c", 1, [user("hello " * 200)], context_window=8_192, max_output_tokens=1_024), b"c"
    )
    client = Client(settings, parts.store, None)
    stats = await client.context_stats("c")
    budget = math.floor((8_192 - stats.tokens - 1_024) * 0.6)
    counter = counter_for("gpt-4o-mini", settings.budget)

    fitted = await client.fit_files("c", FILES)

    assert (stats.window, stats.window - stats.available) == (8_192, 1_024)
    assert budget == file_budget(stats.window, stats.tokens, 1_024)
    assert [(f.name, f.action) for f in fitted] == [("notes.md", "kept"), ("report.txt", "truncated")]
    assert budget - 100 < sum(counter.text(f.text) for f in fitted) <= budget
    assert fitted == fit_files(FILES, budget, counter.text, max_tokens_per_byte=counter.multiplier)


@pytest.mark.integration
async def test_fit_files_in_calibrated_tokens(parts: Parts, settings: Settings) -> None:
    """Where the provider counts twice our estimate, files get half as many estimated tokens."""
    await parts.turns.handle(
        turn_bytes("c", 1, [user("hello")], context_window=8_192, max_output_tokens=1_024), b"c"
    )
    await parts.store.set_meta("c", calibration=2.0)
    client = Client(settings, parts.store, None)
    stats = await client.context_stats("c")
    budget = file_budget(stats.window, stats.tokens, 1_024)
    counter = counter_for("gpt-4o-mini", settings.budget)

    fitted = await client.fit_files("c", FILES)

    assert 2 * sum(counter.text(f.text) for f in fitted) <= budget
    assert fitted == fit_files(FILES, budget // 2, counter.text, max_tokens_per_byte=counter.multiplier)


@pytest.mark.integration
async def test_artifacts_are_listed_with_whether_the_history_carries_them(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published
) -> None:
    """Issue 9: `Client.artifacts()` lists every archived artifact, first seen first, and what the history lost."""
    done, parts = await compact_mentions(redis_client, settings, published)
    store = parts.store
    found = await Client(settings, store, None).artifacts("a")
    assert [a.seq for a in found] == sorted(a.seq for a in found)
    assert {a.kind for a in found} == {"cmd", "error", "host", "id"}
    # Turn 1 is the task, kept verbatim: the archive starts with turn 2.
    assert ("cmd", "kubectl rollout restart deployment/svc-2 -n prod", 2, 2) in [
        (a.kind, a.text, a.seq, a.n) for a in found
    ]
    lost = [a for a in found if not a.in_history]
    assert len(lost) == done.artifacts_dropped > 0
    shown = "\n".join(text_of(m) for m in await Client(settings, store, None).messages("a"))
    assert all(a.text not in shown for a in lost if a.kind in {"cmd", "id"})
    assert all(a.text in shown for a in found if a.in_history and a.kind in {"cmd", "id"})
    with pytest.raises(ConversationNotFound, match="no conversation 'unknown' is stored"):
        await Client(settings, store, None).artifacts("unknown")


@pytest.mark.integration
async def test_span_attributes_say_compacted_only_once_the_history_was(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published
) -> None:
    """Issue 36: the GenAI conventions' attributes for the runtime's inference span; `compacted`
    is set true only, never false."""
    _, parts = await compact_mentions(redis_client, settings, published)
    client = Client(settings, parts.store, None)
    await parts.turns.handle(turn_bytes("fresh", 1, [user("hello")]), b"fresh")

    assert await client.span_attributes("a") == {
        "gen_ai.conversation.id": "a",
        "gen_ai.conversation.compacted": True,
    }
    assert await client.span_attributes("fresh") == {"gen_ai.conversation.id": "fresh"}
