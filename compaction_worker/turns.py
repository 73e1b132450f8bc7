"""The per-turn path: validate, append, check the budget, record a job; bad input to the DLQ.

It never waits on an LLM: compactions run later, from the job queue (see compactor.py).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import ValidationError

from compaction_worker.errors import BadEventError, DeadLetterReason
from compaction_worker.events import (
    CompactionMode,
    DeadLetter,
    Trigger,
    TurnEvent,
)
from compaction_worker.jobs import JobQueue
from compaction_worker.overflow import detect_overflow
from compaction_worker.publisher import Publisher, encode
from compaction_worker.settings import Settings
from compaction_worker.store import JobRequest, Meta, NewMessage, Store
from compaction_worker.tokens import (
    budget_for,
    calibrate,
    counter_for,
)
from compaction_worker.windows import resolve_window

log = logging.getLogger(__name__)


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
            settings,
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
        _, budget = budget_for(meta.model, self.settings.budget, meta.context_window, meta.max_output_tokens)
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
        await self.publish(self.settings.topics.dlq, encode(record), key)


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


Handler = Callable[[bytes, bytes | None, int | None, int | None], Awaitable[TurnOutcome]]
