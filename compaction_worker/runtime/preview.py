"""A compaction computed and not applied: what it would change (``Client.preview_compaction``,
``compaction-worker compact --dry-run``).

It runs what a manual compaction runs (the same limits, summarizers and pipeline, on the same
snapshot) and writes nothing: no lock, no commit, no event. With a deterministic summarizer
(the extractive one) the history it shows is the one a manual compaction then commits, byte
for byte, while no turn arrives in between; an LLM summarizer is called (and paid for) and may
word its summary differently the next time.

A proposal (``pipeline.approval: manual``) is such a result that the worker computed and stored
(state/proposals.py): ``Client.proposal`` shows it the same way, and ``Client.apply`` commits
exactly it, the LLM's summary included. After turns have moved the history past it, it is shown
as it was proposed (its own counts with its own messages), marked ``stale``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from compaction_worker import strategies
from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.contracts.events import Outcome, StandingStateReport, Trigger
from compaction_worker.contracts.history import render, summary_message_text
from compaction_worker.conversation.meta import Job
from compaction_worker.errors import ConversationNotFound
from compaction_worker.runtime.compactor import applied
from compaction_worker.runtime.limits import run_limits
from compaction_worker.settings import Settings
from compaction_worker.state.proposals import Proposal, replaced_count
from compaction_worker.state.store import Snapshot, Store
from compaction_worker.summaries.factory import Summarizers, configured_summarizers
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
    compaction_id: uuid.UUID | None = None
    """A proposal's id (``Client.proposal``); None for a preview computed now."""
    stale: bool = False
    """A proposal the history has moved past (turns arrived, or another commit): every field is
    still the proposal's own, as computed, not the history's now; applying it recomputes it."""
    turns_since: int = 0
    """A proposal's: the turns that arrived after it was computed (0 for a preview computed now)."""


async def preview(
    store: Store,
    settings: Settings,
    conversation_id: str,
    *,
    instructions: str | None = None,
    summarizers: Summarizers | None = None,
) -> Preview:
    """Compute a manual compaction of ``conversation_id`` (with ``instructions`` added to its own)
    and return what it would change, writing nothing: under the conversation's settings profile,
    with its configured summarizers unless ``summarizers`` replaces them, as the compactor.
    ConversationNotFound when no turn of it is stored."""
    snapshot = await store.snapshot(conversation_id)
    meta = snapshot.meta
    if not meta.last_seq:
        raise ConversationNotFound(conversation_id)
    settings = settings.for_profile(meta.profile)
    summarizers = summarizers or configured_summarizers(settings)
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
    return _preview_of(
        conversation_id, snapshot, result=result, counter=counter, scale=planned.scale, settings=settings
    )


def proposal_preview(
    conversation_id: str, proposal: Proposal, snapshot: Snapshot, settings: Settings
) -> Preview:
    """``proposal`` as it was proposed (``Client.proposal``): the history applying it commits, with the
    counts it was computed with. When the conversation (``snapshot``) has moved past it, it is still
    shown whole, never its messages with today's counts: ``stale``, and ``error`` says what changed."""
    meta, result = snapshot.meta, proposal.result
    history = snapshot.history.with_parts(result.draft.chunks, result.draft.entries)
    turns = meta.last_seq - proposal.last_seq
    stale = not proposal.matches(snapshot)
    replaced = proposal.replaced
    if replaced is None:  # stored by an earlier release: count it on what it was computed from,
        # the history's first entries (while no commit moved the version, turns only append)
        replaced = replaced_count(snapshot.history.entries[: proposal.entry_count], history.entries)
    return Preview(
        conversation_id=conversation_id,
        version=proposal.version,
        outcome=Outcome.COMPACTED,  # only a result that shrinks the history is proposed
        tokens_before=proposal.tokens_before,
        tokens_after=int(result.tokens_after * proposal.scale),
        stages=result.stages,
        messages=render(history, settings.pipeline.summary_placement),
        replaced=replaced,
        summary=summary_message_text(history.chunks) if history.chunks else None,
        standing=result.standing,
        error=_staleness(proposal, meta.version, turns) if stale else result.error,
        compaction_id=proposal.compaction_id,
        stale=stale,
        turns_since=turns,
    )


def _staleness(proposal: Proposal, version: int, turns: int) -> str:
    """What moved the history past ``proposal``, for its preview's ``error``."""
    changes = [f"{turns} turn{'s' if turns != 1 else ''} arrived"] if turns else []
    if version != proposal.version:
        changes.append(f"version {proposal.version} became {version}")
    since = " and ".join(changes) or "the history changed"
    return f"stale: {since} since it was proposed (at turn {proposal.last_seq}); applying it recomputes it"


def _preview_of(
    conversation_id: str,
    snapshot: Snapshot,
    *,
    result: strategies.CompactionResult,
    counter: TokenCounter,
    scale: float,
    settings: Settings,
) -> Preview:
    meta = snapshot.meta
    # As the compactor: only a result that shrinks the history is committed.
    commits = result.shrinks
    history = applied(snapshot.history, result, counter)[0] if commits else snapshot.history
    return Preview(
        conversation_id=conversation_id,
        version=meta.version,
        outcome=Outcome.COMPACTED if commits else Outcome.NOOP,
        tokens_before=int(meta.total_tokens * scale),
        tokens_after=int(result.tokens_after * scale) if commits else int(meta.total_tokens * scale),
        stages=result.stages if commits else (),
        messages=render(history, settings.pipeline.summary_placement),
        replaced=replaced_count(snapshot.history.entries, history.entries) if commits else 0,
        summary=summary_message_text(history.chunks) if history.chunks else None,
        standing=result.standing if commits else None,
        error=result.error if commits else (result.error or "the compaction would not shrink the history"),
    )
