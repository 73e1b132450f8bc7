"""A compaction proposed and not applied (``pipeline.approval: manual``, issue 37).

The compactor stores what its run computed, whole, so that ``Client.apply`` commits exactly the
history the runtime was shown (an LLM's summary is not computed twice); and the conversation it
was computed from (``version``, ``last_seq``, the entry count), so that a proposal the history
has moved past is recomputed, never applied stale. One proposal per conversation, in its own
key (conversation/keys.py), written and removed under the conversation's lock.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from compaction_worker import strategies
from compaction_worker.contracts.events import LlmUsage, Outcome, StandingStateReport, Trigger
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.conversation.meta import Meta
from compaction_worker.state.scripts import as_text
from compaction_worker.state.store import Snapshot, Store


@dataclass(frozen=True, slots=True)
class Proposal:
    """A computed compaction waiting for approval, with what its run reported."""

    compaction_id: uuid.UUID
    trigger: Trigger
    version: int
    last_seq: int
    entry_count: int
    """What it was computed from: the conversation's version, last turn and verbatim entries."""
    window: int
    target: int
    scale: float
    tokens_before: int
    circuit_open: bool
    llm_failures: int
    duration_ms: int
    """How long its run took to compute it."""
    result: strategies.CompactionResult
    instructions: str | None = None
    replaced: int | None = None
    """Messages of the history it was computed from that it no longer carries verbatim
    (:func:`replaced_count`); None in a proposal stored before it was kept."""

    def matches(self, snapshot: Snapshot) -> bool:
        """Whether the conversation is still the one it was computed from (no turn, no commit since)."""
        return self.made_from(snapshot.meta, snapshot.entry_count)

    def made_from(self, meta: Meta, entry_count: int) -> bool:
        """Whether a conversation at ``meta``, its history holding ``entry_count`` verbatim entries,
        is the one it was computed from (a status knows the count without reading the history)."""
        return (meta.version, meta.last_seq, entry_count) == (self.version, self.last_seq, self.entry_count)

    def to_json(self) -> str:
        result = self.result
        data = {
            "compaction_id": str(self.compaction_id),
            "trigger": self.trigger.value,
            **{name: getattr(self, name) for name in _PLAIN},
            "result": {
                "outcome": result.outcome.value,
                "chunks": [c.to_json() for c in result.draft.chunks],
                "entries": [e.to_json() for e in result.draft.entries],
                "tokens_before": result.tokens_before,
                "tokens_after": result.tokens_after,
                "messages_before": result.messages_before,
                "messages_after": result.messages_after,
                "stages": list(result.stages),
                "reports": [[r.stage, r.tokens_saved, r.detail] for r in result.reports],
                "summary_tokens": result.summary_tokens,
                "summarizer": result.summarizer,
                "usage": result.usage.model_dump(mode="json"),
                "error": result.error,
                "summarizers_tried": result.summarizers_tried,
                "summarizer_failures": result.summarizer_failures,
                "notes": list(result.notes),
                "standing": result.standing.model_dump(mode="json") if result.standing else None,
            },
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Proposal:
        data = json.loads(raw)
        r: dict[str, Any] = data["result"]
        result = strategies.CompactionResult(
            outcome=Outcome(r["outcome"]),
            draft=strategies.Draft(
                tuple(SummaryChunk.from_json(c) for c in r["chunks"]),
                tuple(Entry.from_json(e) for e in r["entries"]),
            ),
            tokens_before=r["tokens_before"],
            tokens_after=r["tokens_after"],
            messages_before=r["messages_before"],
            messages_after=r["messages_after"],
            stages=tuple(r["stages"]),
            reports=tuple(strategies.StageReport(*report) for report in r["reports"]),
            summary_tokens=r["summary_tokens"],
            summarizer=r["summarizer"],
            usage=LlmUsage.model_validate(r["usage"]),
            error=r["error"],
            summarizers_tried=r["summarizers_tried"],
            summarizer_failures=r["summarizer_failures"],
            notes=tuple(r["notes"]),
            standing=StandingStateReport.model_validate(r["standing"]) if r["standing"] else None,
        )
        return cls(
            compaction_id=uuid.UUID(data["compaction_id"]),
            trigger=Trigger(data["trigger"]),
            result=result,
            # A field with a default may be absent: stored by a release that did not have it.
            **{name: data[name] for name in _PLAIN if name in data},
        )


_PLAIN = tuple(f.name for f in fields(Proposal) if f.name not in ("compaction_id", "trigger", "result"))
"""The fields a proposal stores as they are (JSON numbers, booleans, text), in their stored order."""


def replaced_count(before: Sequence[Entry], after: Sequence[Entry]) -> int:
    """How many of the verbatim messages in ``before`` the entries ``after`` no longer carry verbatim
    (summarized, pruned or cut): a preview's and a proposal's ``replaced``."""
    verbatim = {e.n for e in after if e.edit is None}
    return sum(1 for e in before if e.edit is None and e.n not in verbatim)


class Proposals:
    """The pending proposal of each conversation: stored, read, removed (under the conversation's lock)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def put(self, conversation_id: str, proposal: Proposal) -> None:
        """Store ``proposal``, replacing any earlier one; it expires with the retention (an idle
        conversation's keys expire together, and the turn script renews them all)."""
        ttl = self.store.retention_ms or None
        await self.store.redis.set(self.store.keys(conversation_id).proposal, proposal.to_json(), px=ttl)

    async def get(self, conversation_id: str) -> Proposal | None:
        raw = await self.store.redis.get(self.store.keys(conversation_id).proposal)
        return None if raw is None else Proposal.from_json(as_text(raw))

    async def remove(self, conversation_id: str) -> None:
        await self.store.redis.delete(self.store.keys(conversation_id).proposal)
