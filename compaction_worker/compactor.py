"""One compaction run: lock, read, pipeline, fenced commit, started/completed events."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from compaction_worker import strategies
from compaction_worker.errors import StaleFenceError
from compaction_worker.events import (
    CompactionCompleted,
    CompactionStarted,
    ContextStatus,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.extractive import ExtractiveSummarizer
from compaction_worker.jobs import Claim, JobQueue
from compaction_worker.lock import Locks
from compaction_worker.overflow import detect_overflow
from compaction_worker.publisher import Publisher, encode
from compaction_worker.settings import Settings
from compaction_worker.store import Job, Meta, Snapshot, Store
from compaction_worker.summarizer import Summarizer, make_summarizer
from compaction_worker.tokens import (
    CALIBRATION_BOUNDS,
    Budget,
    TokenCounter,
    budget_for,
    counter_for,
)

log = logging.getLogger(__name__)


class Compactor:
    """Runs one pending compaction: lock, read, pipeline, commit, events."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        locks: Locks,
        jobs: JobQueue,
        publish: Publisher,
        *,
        summarizers: Callable[[str, TokenCounter], Sequence[Summarizer]] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.locks = locks
        self.jobs = jobs
        self.publish = publish
        self.summarizers = summarizers or self.default_summarizers

    def default_summarizers(self, model: str, counter: TokenCounter) -> Sequence[Summarizer]:
        """The configured summarizer, then the deterministic extractive one as the fallback."""
        primary = make_summarizer(self.settings.summarizer, counter.text)
        if isinstance(primary, ExtractiveSummarizer):
            return (primary,)
        return (primary, ExtractiveSummarizer(counter.text))

    async def run(self, claim: Claim) -> CompactionCompleted | None:
        """Run the job a claim points at; None when there was nothing to do or the lock was busy."""
        cid = claim.conversation_id
        job = await self.jobs.load(claim)
        if job is None:
            await self.jobs.finish(claim, None)
            return None
        async with self.locks.held(cid, self.store.keys(cid)) as lease:
            if lease is None:
                await self.jobs.postpone(claim, self.settings.worker.lock_ttl_seconds / 2)
                return None
            completed = await self._compact(job, lease.fence, lease.token)
        await self.jobs.finish(claim, job)
        if completed.outcome is Outcome.COMPACTED:
            await self._reschedule_if_still_over(cid)
        return completed

    async def _compact(self, job: Job, fence: int, lock_token: str) -> CompactionCompleted:
        cid = job.conversation_id
        started_at = time.monotonic()
        snapshot = await self.store.snapshot(cid)
        meta = snapshot.meta
        counter = counter_for(meta.model, self.settings.budget)
        info, budget = budget_for(
            meta.model, self.settings.budget, meta.context_window, meta.max_output_tokens
        )
        # Limits are in our estimate's units; calibration converts provider tokens back.
        target, scale = budget.target, meta.calibration or 1.0
        if job.trigger is Trigger.REACTIVE:
            target, scale = _reactive(job, meta, budget)
        limits = limits_for(self.settings, meta, budget, target, scale, force=job.trigger is Trigger.MANUAL)
        if job.trigger is Trigger.REACTIVE and _estimate(snapshot, counter) <= limits.target:
            # The provider refused this history, so "already under the target" is our
            # estimate's mistake (no numbers to calibrate with, or beyond the clamp):
            # compact anyway, as far as the pipeline goes, instead of a no-op.
            limits = replace(limits, force=True)
        compaction_id = uuid.uuid4()
        tokens_before = int(meta.total_tokens * scale)
        await self.publish(
            self.settings.topics.started,
            encode(
                CompactionStarted(
                    conversation_id=cid,
                    compaction_id=compaction_id,
                    trigger=job.trigger,
                    model=meta.model,
                    tokens_before=tokens_before,
                    window=budget.window,
                    threshold=budget.threshold,
                    target=target,
                    version=meta.version,
                )
            ),
            cid.encode(),
        )
        try:
            result = await strategies.compact(
                snapshot.history,
                limits,
                self.summarizers(meta.model, counter),
                counter,
                settings=self.settings.pipeline,
                conversation_id=cid,
                conversation_model=meta.model,
            )
            outcome, version, status, error = await self._settle(
                cid, snapshot, result, fence=fence, lock_token=lock_token, job=job
            )
        except StaleFenceError as e:
            result = None
            outcome, version, status, error = Outcome.FAILED, meta.version, meta.context_status, str(e)
        except Exception as e:  # a compaction failure is an event, never a dead worker
            log.exception("compaction of %s failed", cid)
            result = None
            outcome, version, status, error = (
                Outcome.FAILED,
                meta.version,
                meta.context_status,
                f"{type(e).__name__}: {e}",
            )
        if outcome is Outcome.FAILED:
            await self._record_failure(cid, meta)
        completed = CompactionCompleted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=job.trigger,
            outcome=outcome,
            stages=list(result.stages) if result else [],
            stage_savings=_stage_savings(result, scale) if result and outcome is Outcome.COMPACTED else {},
            tokens_before=tokens_before,
            tokens_after=int(result.tokens_after * scale)
            if result and outcome is Outcome.COMPACTED
            else tokens_before,
            messages_before=result.messages_before if result else 0,
            messages_after=(result.messages_after if outcome is Outcome.COMPACTED else result.messages_before)
            if result
            else 0,
            summary_tokens=result.summary_tokens if result and outcome is Outcome.COMPACTED else 0,
            summarizer_model=result.summarizer if result else None,
            llm_usage=result.usage if result else LlmUsage(),
            window=budget.window,
            target=target,
            version=version,
            context_status=status,
            duration_ms=int((time.monotonic() - started_at) * 1000),
            error=error,
        )
        await self.publish(self.settings.topics.completed, encode(completed), cid.encode())
        log.info(
            "compaction of %s: %s, %s -> %s tokens (window %s, target %s)",
            cid,
            outcome.value,
            completed.tokens_before,
            completed.tokens_after,
            info.window,
            target,
        )
        return completed

    async def _settle(
        self,
        cid: str,
        snapshot: Snapshot,
        result: strategies.CompactionResult,
        *,
        fence: int,
        lock_token: str,
        job: Job,
    ) -> tuple[Outcome, int, ContextStatus, str | None]:
        if result.outcome is Outcome.COMPACTED and result.tokens_after < result.tokens_before:
            return await self._commit(cid, snapshot, result, fence=fence, lock_token=lock_token, job=job)
        meta = snapshot.meta
        error = result.error
        if result.outcome is Outcome.COMPACTED:
            # A forced run (manual, or reactive under our estimate) can turn a short span
            # into a summary turn that costs more than the span did: committing that would
            # grow a history the provider may just have called too long (invariant 5).
            error = f"the compaction would not shrink the history ({result.tokens_before} -> {result.tokens_after})"
        await self.store.set_meta(cid, noop_tokens=int(meta.total_tokens * meta.calibration) or 1)
        return Outcome.NOOP, meta.version, meta.context_status, error

    async def _commit(
        self,
        cid: str,
        snapshot: Snapshot,
        result: strategies.CompactionResult,
        *,
        fence: int,
        lock_token: str,
        job: Job,
    ) -> tuple[Outcome, int, ContextStatus, str | None]:
        meta = snapshot.meta
        overhead = strategies.summary_overhead(counter_for(meta.model, self.settings.budget))
        old = strategies.draft_tokens(
            strategies.Draft(snapshot.history.chunks, snapshot.history.entries), overhead
        )
        new = strategies.draft_tokens(result.draft, overhead)
        status = ContextStatus.SUMMARIZED if result.draft.chunks else ContextStatus.FULL
        record: Mapping[str, Any] = {
            "version": meta.version + 1,
            "trigger": job.trigger.value,
            "at": time.time(),
            "stages": list(result.stages),
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "chunks_before": [c.to_json() for c in snapshot.history.chunks],
            "covered_through_n": max((c.last_n for c in result.draft.chunks), default=0),
        }
        committed = await self.store.commit(
            cid,
            fence=fence,
            lock_token=lock_token,
            expected_version=meta.version,
            consumed=snapshot.entry_count,
            chunks=result.draft.chunks,
            entries=result.draft.entries,
            token_delta=new - old,
            status=status,
            record=record,
        )
        return Outcome.COMPACTED, committed.version, status, result.error

    async def _record_failure(self, cid: str, meta: Meta) -> None:
        failures = meta.failures + 1
        backoff = min(300.0, self.settings.worker.retry_backoff_seconds * 2 ** min(failures, 8))
        await self.store.set_meta(cid, failures=failures, retry_after=time.time() + backoff)

    async def _reschedule_if_still_over(self, cid: str) -> None:
        """Turns appended during the compaction may have pushed it over again."""
        meta = await self.store.meta(cid)
        _, budget = budget_for(meta.model, self.settings.budget, meta.context_window, meta.max_output_tokens)
        if int(meta.total_tokens * meta.calibration) >= budget.threshold:
            await self.jobs.schedule(cid, Trigger.THRESHOLD)


def limits_for(
    settings: Settings, meta: Meta, budget: Budget, target: int, scale: float, *, force: bool
) -> strategies.Limits:
    """The pipeline's limits, in our estimate's units (``scale`` converts provider tokens back)."""
    return strategies.Limits(
        target=int(target / scale),
        fixed_tokens=meta.fixed_tokens,
        window=int(budget.window / scale),
        tail_max_messages=settings.tail.max_messages,
        tail_max_tokens=int(settings.tail.max_fraction * budget.window / scale),
        max_summary_tokens=settings.summarizer.max_summary_tokens,
        chunk_budget=int(target / scale * settings.pipeline.chunk_budget_fraction),
        force=force,
    )


def _reactive(job: Job, meta: Meta, budget: Budget) -> tuple[int, float]:
    """The target and estimate scale of a reactive compaction.

    The provider's maximum, when its error states one, lowers the target. Its count of the
    rejected prompt, against our estimate of that same prompt (stored with the job), is
    the most direct calibration there is: the stored factor moved only part of the way
    toward it (a moving average, like usage reports), but this compaction uses the whole
    ratio when it is the larger, so that the compacted history does not overflow again.
    The ratio is clamped like the factor: far outside those bounds the runtime sent more
    than the effective history, and shrinking the history by that much would not help.
    """
    overflow = detect_overflow(job.error) if job.error else None
    target = budget.reactive_target(overflow.max_tokens if overflow else None)
    scale = meta.calibration or 1.0
    if overflow is not None and overflow.actual_tokens and job.estimate > 0:
        low, high = CALIBRATION_BOUNDS
        scale = max(scale, min(high, max(low, overflow.actual_tokens / job.estimate)))
    return target, scale


def _estimate(snapshot: Snapshot, counter: TokenCounter) -> int:
    """The history's total as the pipeline measures it (estimate units, fixed tokens included)."""
    history = snapshot.history
    overhead = strategies.summary_overhead(counter)
    return snapshot.meta.fixed_tokens + strategies.draft_tokens(
        strategies.Draft(history.chunks, history.entries), overhead
    )


def _stage_savings(result: strategies.CompactionResult, scale: float) -> dict[str, int]:
    """Tokens each stage saved, in the event's (calibrated) units."""
    savings: dict[str, int] = {}
    for report in result.reports:
        savings[report.stage] = savings.get(report.stage, 0) + int(report.tokens_saved * scale)
    return savings
