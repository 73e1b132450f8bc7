"""What one compaction run reports: the facts fixed before its pipeline, and its events built from them.

The compactor (runtime/compactor.py) decides; this module only says it, so that every way a
run ends (a commit, a no-op, a failure, a stale fence) reports the same fields the same way.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from compaction_worker import strategies
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionCost,
    CompactionStarted,
    ContextStatus,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.contracts.history import summary_message_text
from compaction_worker.conversation.meta import Meta


@dataclass(frozen=True, slots=True)
class Run:
    """What one run's events report, fixed before the pipeline starts."""

    conversation_id: str
    compaction_id: uuid.UUID
    trigger: Trigger
    window: int
    target: int
    scale: float
    tokens_before: int
    started_at: float
    circuit_open: bool
    instructions: str | None = None
    """The instructions the run applies (the standing ones, then the request's), if any."""
    with_summary: bool = False
    """Whether a commit's event carries the summary text (``topics.completed_summary``)."""

    def started(self, meta: Meta, threshold: int) -> CompactionStarted:
        """The ``compaction.started`` event, from the meta the run read."""
        return CompactionStarted(
            conversation_id=self.conversation_id,
            compaction_id=self.compaction_id,
            trigger=self.trigger,
            model=meta.model,
            tokens_before=self.tokens_before,
            window=self.window,
            threshold=threshold,
            target=self.target,
            version=meta.version,
        )

    def completed(
        self,
        outcome: Outcome,
        *,
        version: int,
        status: ContextStatus,
        result: strategies.CompactionResult | None,
        error: str | None,
        llm_failures: int,
        artifacts_dropped: int = 0,
        cost: CompactionCost | None = None,
    ) -> CompactionCompleted:
        """The ``compaction.completed`` event; only a commit reports savings and its ``cost``."""
        compacted = result if outcome is Outcome.COMPACTED else None
        return CompactionCompleted(
            conversation_id=self.conversation_id,
            compaction_id=self.compaction_id,
            trigger=self.trigger,
            outcome=outcome,
            stages=list(result.stages) if result else [],
            stage_savings=_stage_savings(compacted, self.scale) if compacted else {},
            tokens_before=self.tokens_before,
            tokens_after=int(compacted.tokens_after * self.scale) if compacted else self.tokens_before,
            messages_before=result.messages_before if result else 0,
            messages_after=(result.messages_after if compacted else result.messages_before) if result else 0,
            summary_tokens=compacted.summary_tokens if compacted else 0,
            summarizer_model=result.summarizer if result else None,
            llm_usage=result.usage if result else LlmUsage(),
            window=self.window,
            target=self.target,
            version=version,
            context_status=status,
            duration_ms=int((time.monotonic() - self.started_at) * 1000),
            error=error,
            circuit_open=self.circuit_open,
            llm_failures=llm_failures,
            artifacts_dropped=artifacts_dropped,
            summary_items_refused=compacted.items_refused if compacted else 0,
            summary_items_let_go=compacted.items_let_go if compacted else 0,
            standing_state=compacted.standing if compacted else None,
            notes=list(result.notes) if result else [],
            instructions=self.instructions,
            cost=cost if compacted else None,
            summary=summary_message_text(compacted.draft.chunks)
            if compacted and self.with_summary and compacted.draft.chunks
            else None,
        )

    def unchanged(
        self,
        meta: Meta,
        outcome: Outcome,
        result: strategies.CompactionResult | None,
        *,
        error: str | None,
        llm_failures: int,
    ) -> CompactionCompleted:
        """The event of a run that committed nothing: the conversation stays at its version."""
        return self.completed(
            outcome,
            version=meta.version,
            status=meta.context_status,
            result=result,
            error=error,
            llm_failures=llm_failures,
        )


def llm_failed(result: strategies.CompactionResult, summarizers: int, circuit_open: bool) -> bool | None:
    """The run's verdict on the primary (LLM) summarizer, for its model's breaker: True when it
    failed, False when it worked.

    None when the LLM was not asked: the circuit was open, there is no fallback (nothing to
    switch to), or no summary was needed (the cheap stages sufficed).
    """
    if circuit_open or summarizers < 2 or result.summarizers_tried == 0:
        return None
    return bool(result.summarizer_failures)


def context_status(draft: strategies.Draft) -> ContextStatus:
    """``summarized`` when anything the model saw was replaced: a chunk, or a pruned, de-duplicated
    or truncated message (the event's stages say which); messages repair made up replace nothing."""
    edited = any(e.edit is not None and not e.synthetic for e in draft.entries)
    return ContextStatus.SUMMARIZED if draft.chunks or edited else ContextStatus.FULL


def _stage_savings(result: strategies.CompactionResult, scale: float) -> dict[str, int]:
    """Tokens each stage saved, in the event's (calibrated) units."""
    savings: dict[str, int] = {}
    for report in result.reports:
        savings[report.stage] = savings.get(report.stage, 0) + int(report.tokens_saved * scale)
    return savings
