"""Orchestration: what happens to one turn, what one compaction run does, and a rewind.

The per-turn path (validate, append, check the budget, record a job) never waits on an
LLM: compactions run later, from the job queue, under the conversation's lock. A rewind
(an operator's undo of a compaction) takes the same lock and commits through the same fence.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from compaction_worker import strategies
from compaction_worker.errors import BadEventError, DeadLetterReason, LockNotAcquiredError, StaleFenceError
from compaction_worker.events import (
    CompactionCompleted,
    CompactionMode,
    CompactionStarted,
    ContextStatus,
    DeadLetter,
    LlmUsage,
    Outcome,
    Trigger,
    TurnEvent,
)
from compaction_worker.extractive import ExtractiveSummarizer
from compaction_worker.history import Entry, SummaryChunk, render
from compaction_worker.jobs import Claim, JobQueue
from compaction_worker.lock import Locks
from compaction_worker.overflow import detect_overflow
from compaction_worker.settings import Settings
from compaction_worker.store import Job, JobRequest, Meta, NewMessage, Snapshot, Store
from compaction_worker.summarizer import Summarizer, make_summarizer
from compaction_worker.tokens import (
    CALIBRATION_BOUNDS,
    Budget,
    TokenCounter,
    calibrate,
    compute_budget,
    counter_for,
)
from compaction_worker.windows import WindowInfo, resolve_window

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Sends one event to a topic, keyed (the worker's broker, or a test double)."""

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None: ...


class TurnStatus(StrEnum):
    """What the per-turn path did with one input event."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    BUFFERED = "buffered"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """The result of handling one input event."""

    status: TurnStatus
    conversation_id: str | None = None
    scheduled: Trigger | None = None
    reason: str | None = None


def _dump(event: BaseModel) -> bytes:
    return event.model_dump_json().encode()


def budget_for(
    meta_model: str, settings: Settings, context_window: int | None, max_output: int | None
) -> tuple[WindowInfo, Budget]:
    """The window and budget of a conversation's model, with event overrides applied."""
    info = resolve_window(meta_model, settings.budget, context_window)
    return info, compute_budget(info, settings.budget, max_output)


class TurnHandler:
    """Validates, stores and budgets one ``conversation.turn`` event."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        jobs: JobQueue,
        publish: Publisher,
        on_scheduled: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs
        self.publish = publish
        self.on_scheduled = on_scheduled or (lambda _cid: None)

    async def handle(
        self, raw: bytes, key: bytes | None = None, partition: int | None = None, offset: int | None = None
    ) -> TurnOutcome:
        """Handle one event; bad input becomes a dead-letter record, never an exception.

        Infrastructure errors (Redis down) do propagate: the caller must not acknowledge
        the event, so that it is redelivered once Redis is back.
        """
        try:
            event = self.parse(raw, key)
        except BadEventError as bad:
            await self.dead_letter(raw, key, partition, offset, bad=bad)
            return TurnOutcome(TurnStatus.DEAD_LETTERED, bad.conversation_id, reason=bad.reason.value)
        outcome = await self._apply(event, raw)
        if outcome.status is TurnStatus.APPENDED:
            await self._drain_pending(event.conversation_id, event.turn_seq)
        return outcome

    def parse(self, raw: bytes, key: bytes | None) -> TurnEvent:
        """Decode and validate an event, or raise BadEventError with the reason."""
        limit = self.settings.kafka.max_event_bytes
        if len(raw) > limit:
            raise BadEventError(DeadLetterReason.OVERSIZED, f"{len(raw)} bytes, over the {limit}-byte limit")
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadEventError(DeadLetterReason.MALFORMED_JSON, str(e)) from e
        conversation_id = data.get("conversation_id") if isinstance(data, dict) else None
        cid = conversation_id if isinstance(conversation_id, str) else None
        try:
            event = TurnEvent.model_validate(data)
        except ValidationError as e:
            raise BadEventError(DeadLetterReason.SCHEMA_VIOLATION, _validation_summary(e), cid) from e
        if key is not None and key != event.conversation_id.encode():
            raise BadEventError(
                DeadLetterReason.KEY_MISMATCH,
                f"Kafka key {key!r} is not the conversation id; events must be keyed by conversation_id",
                event.conversation_id,
            )
        if self.settings.budget.fallback_window is None and event.context_window is None:
            info = resolve_window(event.model, self.settings.budget, None)
            if info.source == "fallback":
                raise BadEventError(
                    DeadLetterReason.UNKNOWN_MODEL,
                    f"model {event.model!r} has no known context window and no fallback is configured",
                    event.conversation_id,
                )
        return event

    async def _apply(self, event: TurnEvent, raw: bytes) -> TurnOutcome:
        cid = event.conversation_id
        while True:
            meta = await self.store.meta(cid)
            if event.turn_seq <= meta.last_seq:
                # A redelivery: the request it carried was recorded with the append; make
                # sure it is indexed (the crash may have come between the two writes).
                if await self.store.job(cid) is not None:
                    await self.jobs.mark_due(cid)
                    self.on_scheduled(cid)
                scheduled = await self._check_threshold(cid, meta)
                return TurnOutcome(TurnStatus.DUPLICATE, cid, scheduled)
            if event.turn_seq > meta.last_seq + 1:
                await self.store.buffer_pending(cid, event.turn_seq, raw)
                log.info("turn %s of %s waits for turn %s", event.turn_seq, cid, meta.last_seq + 1)
                return TurnOutcome(TurnStatus.BUFFERED, cid)
            request = _request_of(event)
            status, _, _ = await self._append(event, meta, request)
            if status == "appended":
                break
            # "conflict": another writer appended meanwhile (a rebalance overlap); read again.
        if request is not None:
            await self.jobs.mark_due(cid)
            self.on_scheduled(cid)
            log.info("compaction of %s requested (%s)", cid, request.trigger.value)
            return TurnOutcome(TurnStatus.APPENDED, cid, request.trigger)
        scheduled = await self._check_threshold(cid, await self.store.meta(cid))
        return TurnOutcome(TurnStatus.APPENDED, cid, scheduled)

    async def _append(self, event: TurnEvent, meta: Meta, request: JobRequest | None) -> tuple[str, int, int]:
        settings = self.settings.budget
        counter = counter_for(event.model, settings)
        new = [NewMessage(m.to_dict(), counter.message(m.to_dict())) for m in event.messages]
        _, budget = budget_for(
            event.model,
            self.settings,
            event.context_window or meta.context_window,
            event.max_output_tokens or meta.max_output_tokens,
        )
        fields: dict[str, str | int | float] = {
            "model": event.model,
            "window": budget.window,
            "threshold": budget.threshold,
        }
        if event.system_prompt is not None:
            fields["system_prompt"] = event.system_prompt
            fields["system_tokens"] = counter.text(event.system_prompt) + settings.message_overhead_tokens
        if event.tools is not None:
            fields["tools"] = json.dumps(event.tools, separators=(",", ":"))
            fields["tools_tokens"] = counter.tools(event.tools)
        if event.context_window is not None:
            fields["context_window"] = event.context_window
        if event.max_output_tokens is not None:
            fields["max_output_tokens"] = event.max_output_tokens
        # Our estimate of the prompt of the call this turn reports on (its usage or its error).
        estimate = meta.total_tokens + _input_part(new, event)
        calibration = meta.calibration
        if event.usage is not None:
            calibration = calibrate(calibration, estimate, event.usage.prompt_tokens)
        if request is not None and request.trigger is Trigger.REACTIVE:
            # The provider's count of the rejected prompt is a usage report too; the job
            # keeps the estimate it is paired with, for the compaction to use (_reactive).
            request = replace(request, estimate=estimate)
            overflow = detect_overflow(request.error) if request.error else None
            if overflow is not None and overflow.actual_tokens:
                calibration = calibrate(calibration, estimate, overflow.actual_tokens)
        if calibration != meta.calibration:
            fields["calibration"] = calibration
        return await self.store.append_turn(
            event.conversation_id, event.turn_seq, new, fields, expected_count=meta.msg_count, request=request
        )

    async def _check_threshold(self, cid: str, meta: Meta) -> Trigger | None:
        trigger = self.threshold_trigger(meta)
        if trigger is None:
            return None
        if await self.jobs.schedule(cid, trigger):
            log.info("compaction of %s scheduled (%s)", cid, trigger.value)
        self.on_scheduled(cid)
        return trigger

    def threshold_trigger(self, meta: Meta) -> Trigger | None:
        """The threshold a conversation's estimated total has crossed, if any."""
        if meta.retry_after and time.time() < meta.retry_after:
            return None
        _, budget = budget_for(meta.model, self.settings, meta.context_window, meta.max_output_tokens)
        total = int(meta.total_tokens * meta.calibration)
        regrowth = int(self.settings.budget.noop_regrowth_fraction * budget.available)
        if meta.noop_tokens and total <= meta.noop_tokens + regrowth:
            return None  # the last attempt could not shrink this; wait for real growth
        if total >= budget.threshold:
            return Trigger.THRESHOLD
        if budget.soft_threshold is not None and total >= budget.soft_threshold:
            return Trigger.SOFT_THRESHOLD
        return None

    async def _drain_pending(self, cid: str, seq: int) -> None:
        """Apply, in order, turns that were held behind a gap this turn just filled."""
        while (raw := await self.store.pending_turn(cid, seq + 1)) is not None:
            outcome = await self.handle_held(raw, cid)
            if outcome.status is not TurnStatus.APPENDED:
                return
            seq += 1

    async def handle_held(self, raw: bytes, cid: str) -> TurnOutcome:
        """Apply one held turn (it was valid when it was held)."""
        try:
            event = self.parse(raw, cid.encode())
        except BadEventError as bad:  # settings changed since it was held
            await self.dead_letter(raw, cid.encode(), None, None, bad=bad)
            return TurnOutcome(TurnStatus.DEAD_LETTERED, cid, reason=bad.reason.value)
        return await self._apply(event, raw)

    async def dead_letter(
        self, raw: bytes, key: bytes | None, partition: int | None, offset: int | None, *, bad: BadEventError
    ) -> None:
        """Publish the original bytes and the reason to the dead-letter topic."""
        record = DeadLetter(
            reason=bad.reason,
            detail=bad.detail[:4000],
            conversation_id=bad.conversation_id,
            source_topic=self.settings.topics.turns,
            partition=partition,
            offset=offset,
            key_b64=base64.b64encode(key).decode() if key is not None else None,
            original_b64=base64.b64encode(raw).decode(),
            original_size=len(raw),
        )
        log.warning("dead-lettered an event: %s", bad)
        await self.publish(self.settings.topics.dlq, _dump(record), key)


def _request_of(event: TurnEvent) -> JobRequest | None:
    if event.compaction is None:
        return None
    trigger = Trigger.MANUAL if event.compaction.mode is CompactionMode.FORCE else Trigger.REACTIVE
    return JobRequest(trigger, event.compaction.error)


def _input_part(new: Sequence[NewMessage], event: TurnEvent) -> int:
    """Tokens of this turn's messages that were input to the call its usage reports."""
    last_assistant = max((i for i, m in enumerate(event.messages) if m.role == "assistant"), default=len(new))
    return sum(m.tokens for m in new[:last_assistant])


def _validation_summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:10]:
        where = ".".join(str(p) for p in item["loc"]) or "event"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - 10
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


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
        info, budget = budget_for(meta.model, self.settings, meta.context_window, meta.max_output_tokens)
        # Limits are in our estimate's units; calibration converts provider tokens back.
        target, scale = budget.target, meta.calibration or 1.0
        if job.trigger is Trigger.REACTIVE:
            target, scale = _reactive(job, meta, budget)
        limits = _limits(self.settings, meta, budget, target, scale, force=job.trigger is Trigger.MANUAL)
        if job.trigger is Trigger.REACTIVE and _estimate(snapshot, counter) <= limits.target:
            # The provider refused this history, so "already under the target" is our
            # estimate's mistake (no numbers to calibrate with, or beyond the clamp):
            # compact anyway, as far as the pipeline goes, instead of a no-op.
            limits = replace(limits, force=True)
        compaction_id = uuid.uuid4()
        tokens_before = int(meta.total_tokens * scale)
        await self.publish(
            self.settings.topics.started,
            _dump(
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
        await self.publish(self.settings.topics.completed, _dump(completed), cid.encode())
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
        _, budget = budget_for(meta.model, self.settings, meta.context_window, meta.max_output_tokens)
        if int(meta.total_tokens * meta.calibration) >= budget.threshold:
            await self.jobs.schedule(cid, Trigger.THRESHOLD)


def _limits(
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


@dataclass(frozen=True, slots=True)
class Rewound:
    """A committed rewind: the event it published and what it restored."""

    completed: CompactionCompleted
    rewound_version: int
    chunks: int
    """Summary chunks in the restored history (those that existed before the undone compaction)."""
    restored_messages: int
    """Transcript messages that are entries again, verbatim."""
    over_threshold: bool
    """The restored history is over the threshold: the next turn schedules a compaction."""


class Rewinder:
    """Undoes a committed compaction from the preserved transcript, under the conversation's lock."""

    def __init__(self, settings: Settings, store: Store, locks: Locks, publish: Publisher) -> None:
        self.settings = settings
        self.store = store
        self.locks = locks
        self.publish = publish

    async def rewind(self, conversation_id: str, version: int | None = None) -> Rewound:
        """Restore the history from before compaction ``version`` (default: the latest in effect).

        The rewind commits a new version and publishes ``compaction.started`` and
        ``.completed`` (trigger ``rewind``) together once it is committed: it makes no LLM
        call, so there is nothing to wait for, and consumers that pair the two still can.
        It does not schedule a compaction: the next turn's budget check decides that.
        Raises RewindError (nothing to rewind), LockNotAcquiredError (a compaction is
        running) or StaleFenceError (the lock was lost before the commit).
        """
        cid = conversation_id
        started_at = time.monotonic()
        async with self.locks.held(cid, self.store.keys(cid)) as lease:
            if lease is None:
                raise LockNotAcquiredError(f"{cid} is being compacted right now; try again shortly")
            meta = await self.store.meta(cid)
            _, budget = budget_for(meta.model, self.settings, meta.context_window, meta.max_output_tokens)
            scale = meta.calibration or 1.0
            counter = counter_for(meta.model, self.settings.budget)
            overhead = strategies.summary_overhead(counter)
            limits = _limits(self.settings, meta, budget, budget.target, scale, force=False)
            ctx = strategies.StageContext(limits, self.settings.pipeline, counter, overhead)

            def repair(chunks: tuple[SummaryChunk, ...], entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
                # The pipeline's last stage, as on every compaction commit: verbatim messages
                # next to old chunks may need a synthetic turn to stay valid (invariant 4).
                return strategies.repair(strategies.Draft(chunks, entries), ctx).draft.entries

            result = await self.store.rewind(
                cid,
                fence=lease.fence,
                lock_token=lease.token,
                version=version,
                count=counter.message,
                overhead=overhead,
                repair=repair,
            )
        before = result.before
        restored = before.history.with_parts(result.chunks, result.entries)
        placement = self.settings.pipeline.summary_placement
        compaction_id = uuid.uuid4()
        tokens_before = int(before.meta.total_tokens * scale)
        # The whole total after the rewind, messages appended while it ran included.
        tokens_after = int((result.history_tokens + before.meta.fixed_tokens) * scale)
        started = CompactionStarted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.REWIND,
            model=meta.model,
            tokens_before=tokens_before,
            window=budget.window,
            threshold=budget.threshold,
            target=budget.target,
            version=before.meta.version,
        )
        completed = CompactionCompleted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.REWIND,
            outcome=Outcome.COMPACTED,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            messages_before=len(render(before.history, placement)),
            messages_after=len(render(restored, placement)),
            window=budget.window,
            target=budget.target,
            version=result.version,
            context_status=result.context_status,
            duration_ms=int((time.monotonic() - started_at) * 1000),
        )
        await self.publish(self.settings.topics.started, _dump(started), cid.encode())
        await self.publish(self.settings.topics.completed, _dump(completed), cid.encode())
        log.info(
            "rewound compaction %s of %s: version %s, %s -> %s tokens",
            result.rewound,
            cid,
            result.version,
            tokens_before,
            tokens_after,
        )
        return Rewound(
            completed=completed,
            rewound_version=result.rewound,
            chunks=len(result.chunks),
            restored_messages=sum(1 for e in result.entries if not e.synthetic),
            over_threshold=tokens_after >= budget.threshold,
        )


Handler = Callable[[bytes, bytes | None, int | None, int | None], Awaitable[TurnOutcome]]
