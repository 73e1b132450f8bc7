"""The artifact archive: every artifact ever extracted from what a compaction replaced.

One hash per conversation (``ConversationKeys.artifacts``): field the ledger item
(``"<kind>: <text>"``), value where it was first seen; written before each commit, with
HSETNX, so a retried compaction writes the same archive (docs/design.md, "The artifact archive").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryChunk, render, text_of
from compaction_worker.offload import off_loop
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.keys import conversation_keys
from compaction_worker.state.scripts import Script
from compaction_worker.summaries.artifacts import item_core, item_kind, scan_items
from compaction_worker.summaries.mentions import holds

__all__ = ["Archive", "ArchivedArtifact", "carried", "history_text", "replaced_artifacts"]


@dataclass(frozen=True, slots=True)
class ArchivedArtifact:
    """One archived artifact: its ledger item and the turn (and message) that first named it."""

    item: str
    seq: int
    """The ``turn_seq`` of the first message it was found in (of those archived)."""
    n: int
    """That message's transcript ordinal; 0 when it came from a folded chunk's ledger."""

    @property
    def kind(self) -> str:
        return item_kind(self.item)

    @property
    def text(self) -> str:
        return self.item.partition(": ")[2]

    def value(self) -> str:
        """The stored hash value."""
        return json.dumps({"seq": self.seq, "n": self.n}, separators=(",", ":"))

    @classmethod
    def from_field(cls, item: str | bytes, value: str | bytes) -> ArchivedArtifact:
        data = json.loads(value)
        return cls(item if isinstance(item, str) else item.decode(), int(data["seq"]), int(data["n"]))


def replaced_artifacts(
    before: EffectiveHistory,
    after_chunks: Sequence[SummaryChunk],
    after_entries: Sequence[Entry],
    originals: Mapping[int, Mapping[str, Any]],
) -> list[ArchivedArtifact]:
    """The items of what a compaction replaced: entries it covered or edited, and chunks it folded.

    An entry is read as the transcript wrote it (``originals`` for those edited before),
    since its artifacts are the original's. In message order, first sighting first.
    """
    kept = {(e.n, e.edit) for e in after_entries}
    replaced = [e for e in before.entries if not e.synthetic and (e.n, e.edit) not in kept]
    found: dict[str, ArchivedArtifact] = {}
    messages = [originals.get(e.n, e.message) for e in replaced]
    for index, item in scan_items(messages):
        if item not in found:
            found[item] = ArchivedArtifact(item, replaced[index].seq, replaced[index].n)
    remaining = {c.id for c in after_chunks}
    for chunk in before.chunks:
        if chunk.id not in remaining:
            for item in chunk.artifacts:
                found.setdefault(item, ArchivedArtifact(item, chunk.first_seq, 0))
    return list(found.values())


def history_text(history: EffectiveHistory) -> str:
    """Everything the model reads of a history: contents, summaries with ledgers, tool call arguments."""
    texts: list[str] = []
    for message in render(history):
        texts.append(text_of(message))
        for call in message.get("tool_calls") or ():
            raw = call.get("function", {}).get("arguments")
            if not isinstance(raw, str):
                continue
            texts.append(raw)
            try:
                arguments = json.loads(raw)
            except ValueError:
                continue
            # JSON escapes quotes and backslashes: the decoded values are what the model reads.
            if isinstance(arguments, dict):
                texts.extend(v for v in arguments.values() if isinstance(v, str))
    return "\n".join(texts)


def carried(items: Iterable[str], history: EffectiveHistory) -> set[str]:
    """The items whose core the history holds verbatim (in a ledger or anywhere else it shows)."""
    ledgers = {item for chunk in history.chunks for item in chunk.artifacts}
    text: str | None = None
    out: set[str] = set()
    for item in items:
        if item in ledgers:
            out.add(item)
            continue
        if text is None:
            text = history_text(history)
        if holds(text, item_core(item)):
            out.add(item)
    return out


class Archive:
    """The conversation's archive hash: written before commits, read by the client and the CLI."""

    def __init__(self, redis: RedisClient, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._add = Script(redis, "expiry.lua", "archive_add.lua")

    def key(self, conversation_id: str) -> str:
        return conversation_keys(conversation_id, self.prefix).artifacts

    async def add(self, conversation_id: str, artifacts: Sequence[ArchivedArtifact]) -> None:
        """Archive items not archived yet (a repeat keeps its first sighting); idempotent."""
        if not artifacts:
            return
        keys = conversation_keys(conversation_id, self.prefix)
        items = [a.item for a in artifacts]
        await self._add(
            [keys.artifacts, keys.meta], {"items": items, "values": [a.value() for a in artifacts]}
        )

    async def record(
        self,
        conversation_id: str,
        before: EffectiveHistory,
        after: EffectiveHistory,
        originals: Mapping[int, Mapping[str, Any]],
    ) -> int:
        """Archive what turning ``before`` into ``after`` replaced; how many archived items ``after`` lacks."""
        # Scanning a large span is CPU: in a thread, so the event loop keeps handling turns.
        replaced = await off_loop(replaced_artifacts, before, after.chunks, after.entries, originals)
        await self.add(conversation_id, replaced)
        archived = await self.items(conversation_id)
        return len(archived) - len(await off_loop(carried, archived, after))

    async def items(self, conversation_id: str) -> list[str]:
        """Every archived item, unordered."""
        return [
            k if isinstance(k, str) else k.decode() for k in await self.redis.hkeys(self.key(conversation_id))
        ]

    async def all(self, conversation_id: str) -> list[ArchivedArtifact]:
        """Every archived artifact, in the order first seen (turn, then message)."""
        raw: dict[Any, Any] = await self.redis.hgetall(self.key(conversation_id))
        found = [ArchivedArtifact.from_field(k, v) for k, v in raw.items()]
        return sorted(found, key=lambda a: (a.seq, a.n, a.item))
