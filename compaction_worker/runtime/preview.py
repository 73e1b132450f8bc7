"""A compaction computed and not applied: what it would change (``Client.preview_compaction``,
``compaction-worker compact --dry-run``).

It runs what a manual compaction runs (the same limits, summarizers and pipeline, on the same
snapshot) and writes nothing: no lock, no commit, no event. With a deterministic summarizer
(the extractive one) the history it shows is the one a manual compaction then commits, byte
for byte, while no turn arrives in between; an LLM summarizer is called (and paid for) and may
word its summary differently the next time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from compaction_worker import strategies
from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import Outcome, StandingStateReport, Trigger
from compaction_worker.contracts.history import render, summary_message_text
from compaction_worker.runtime.compactor import Summarizers, applied
from compaction_worker.runtime.limits import run_limits
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import Job
from compaction_worker.state.store import Store
from compaction_worker.summaries.instructions import applied_instructions


@dataclass(frozen=True, slots=True)
class Preview:
    """What a manual compaction of the conversation would do now."""

    conversation_id: str
    version: int
    """The history version it was computed from."""
    outcome: Outcome
    """``compacted`` when it would commit; ``noop`` when it would leave the history as it is."""
    tokens_before: int
    tokens_after: int
    stages: tuple[str, ...]
    messages: list[dict[str, Any]]
    """The effective history it would leave, as ``Client.messages`` renders it (chat form)."""
    replaced: int
    """Messages the history would no longer carry verbatim (summarized, pruned or cut)."""
    summary: str | None
    """The summary the history would start with; None when it would hold none."""
    standing: StandingStateReport | None
    error: str | None


async def preview(
    store: Store,
    settings: Settings,
    summarizers: Summarizers,
    conversation_id: str,
    *,
    instructions: str | None = None,
) -> Preview:
    """Compute a manual compaction of ``conversation_id`` (with ``instructions`` added to its own)
    and return what it would change, writing nothing."""
    snapshot = await store.snapshot(conversation_id)
    meta = snapshot.meta
    counter = counter_for(meta.model, settings.budget)
    job = Job(conversation_id, "preview", Trigger.MANUAL, time.time(), instructions=instructions)
    planned = run_limits(settings, snapshot, counter, job)
    originals = await store.originals(conversation_id, strategies.edited_ordinals(snapshot.history))
    result = await strategies.compact(
        snapshot.history,
        planned.limits,
        list(summarizers(meta.model, counter)),
        counter,
        settings=settings.pipeline,
        originals=originals,
        conversation_id=conversation_id,
        conversation_model=meta.model,
        instructions=applied_instructions(meta.instructions, instructions),
    )
    # As the compactor: only a result that shrinks the history is committed.
    commits = result.shrinks
    history = applied(snapshot.history, result, counter)[0] if commits else snapshot.history
    verbatim = {e.n for e in history.entries if e.edit is None}
    scale = planned.scale
    return Preview(
        conversation_id=conversation_id,
        version=meta.version,
        outcome=Outcome.COMPACTED if commits else Outcome.NOOP,
        tokens_before=int(meta.total_tokens * scale),
        tokens_after=int(result.tokens_after * scale) if commits else int(meta.total_tokens * scale),
        stages=result.stages if commits else (),
        messages=render(history, settings.pipeline.summary_placement),
        replaced=sum(1 for e in snapshot.history.entries if e.edit is None and e.n not in verbatim)
        if commits
        else 0,
        summary=summary_message_text(history.chunks) if history.chunks else None,
        standing=result.standing if commits else None,
        error=result.error if commits else (result.error or "the compaction would not shrink the history"),
    )
