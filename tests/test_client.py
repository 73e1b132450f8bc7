"""The client's reading side: the messages a runtime sends are rendered with the configured placement."""

from __future__ import annotations

from typing import Any, cast

import pytest

from compaction_worker.client import Client
from compaction_worker.history import SUMMARY_ACK, SUMMARY_HEADER, EffectiveHistory, Entry, SummaryChunk
from compaction_worker.settings import Settings
from compaction_worker.store import Meta, Snapshot, Store

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


def test_placement_is_validated() -> None:
    """Only the two placements exist."""
    with pytest.raises(ValueError, match="summary_placement"):
        client("system")
