"""The artifact archive: every artifact ever extracted from what a compaction replaced.

One hash per conversation (``ConversationKeys.artifacts``): field the ledger item
(``"<kind>: <text>"``), value where it was first seen; written before each commit, with
HSETNX, so a retried compaction writes the same archive (docs/design.md, "The artifact archive").
A compaction's ``artifacts_dropped`` is what it let go (:func:`let_go`): of what it replaced,
what the history carried verbatim before it and no longer does (invariant 12).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_worker.contracts.history import (
    RESTORED,
    STANDING,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    render,
    text_of,
)
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.offload import off_loop
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script
from compaction_worker.summaries.artifacts import item_core, item_kind, scan_items
from compaction_worker.summaries.mentions import holds

__all__ = ["Archive", "ArchivedArtifact", "carried", "history_text", "let_go", "replaced_artifacts"]


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
    """The items of what a compaction replaced: entries it covered or edited, the chunks it folded (their
    ledgers and what their summaries state, as the fold's ledger reads them), and the states it wrote
    anew (the standing state's sentences, the restored working state's files).

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
            stated = (item for _, item in scan_items([{"role": "user", "content": chunk.text}]))
            for item in (*chunk.artifacts, *stated):
                found.setdefault(item, ArchivedArtifact(item, chunk.first_seq, 0))
    rewritten = [e.message for e in after_entries if e.synthetic]
    for entry in before.entries:
        if entry.edit in (STANDING, RESTORED) and entry.message not in rewritten:
            for _, item in scan_items(_restated(entry)):
                found.setdefault(item, ArchivedArtifact(item, entry.seq, 0))
    return list(found.values())


def _restated(entry: Entry) -> list[Mapping[str, Any]]:
    """What a state entry restates, as the messages it came from: the standing state's sentences as the
    user's (its rendered labels and headings are no one's words), the working state as a tool's output."""
    if entry.edit == STANDING:
        data = entry.message.get("standing_state") or {}
        return [{"role": "user", "content": str(item.get("text", ""))} for item in data.get("items", ())]
    return [{"role": "tool", "content": text_of(entry.message)}]


def let_go(items: Iterable[str], before: EffectiveHistory, after: EffectiveHistory) -> list[str]:
    """Of ``items``, those ``before`` carried verbatim and ``after`` no longer does, one per core: what
    turning one history into the other lost (an item lost earlier is not lost again; one identifier
    seen in several places, with other words around it, is one loss)."""
    held = carried(items, before)
    kept = carried(held, after)
    lost: dict[str, str] = {}
    for item in held - kept:
        lost.setdefault(item_core(item), item)
    return sorted(lost.values())


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
        """Archive what turning ``before`` into ``after`` replaced; how many of its items that let go.

        The count is this compaction's loss, not the archive's (every item ``after`` lacks, lost by
        any compaction so far): a conversation's events sum to what its history lost, each loss once.
        """
        # Scanning a large span is CPU: in a thread, so the event loop keeps handling turns.
        replaced = await off_loop(replaced_artifacts, before, after.chunks, after.entries, originals)
        await self.add(conversation_id, replaced)
        return len(await off_loop(let_go, [a.item for a in replaced], before, after))

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
