"""The per-turn path: validate, append, check the budget, record a job; bad input to the DLQ.

It never waits on an LLM: compactions run later, from the job queue (compactor.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import ValidationError

from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.budget.tokens import (
    budget_for,
    calibrate,
    conversation_budget,
    counter_for,
)
from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.events import (
    BadEventError,
    CompactionMode,
    DeadLetterReason,
    Trigger,
    TurnEvent,
)
from compaction_worker.observability import metrics, tracing
from compaction_worker.runtime.deadletters import DeadLetters
from compaction_worker.settings import BudgetSettings, Settings
from compaction_worker.state.gaps import GapIndex, HeldTurn, conflicting_duplicate
from compaction_worker.state.jobs import JobQueue, JobRequest
from compaction_worker.state.meta import Meta
from compaction_worker.state.store import AppendResult, AppendStatus, NewMessage, Store

log = logging.getLogger(__name__)


class TurnStatus(StrEnum):
    """What the per-turn path did with one input event."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    BUFFERED = "buffered"
    DEAD_LETTERED = "dead_lettered"


# The turns metric's word for a turn held behind a gap.
_METRIC_STATUS = {TurnStatus.BUFFERED: "held"}


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """The result of handling one input event."""

    status: TurnStatus
    conversation_id: str | None = None
    scheduled: Trigger | None = None
    reason: str | None = None
    next_held: bool | None = None
    """After an append: whether the next turn is held behind a gap (None: not known, look)."""


class TurnHandler:
    """Validates, stores and budgets one ``conversation.turn`` event."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        jobs: JobQueue,
        gaps: GapIndex,
        dead_letters: DeadLetters,
        *,
        on_scheduled: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs
        self.gaps = gaps
        self.dead_letters = dead_letters
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
            await self.dead_letters.send(raw, key, partition, offset, bad=bad)
            metrics.record_turn(TurnStatus.DEAD_LETTERED.value, bad.reason.value)
            return TurnOutcome(TurnStatus.DEAD_LETTERED, bad.conversation_id, reason=bad.reason.value)
        cid = event.conversation_id
        try:
            outcome = await self._apply(event, raw)
        except BadEventError as bad:  # a conflicting duplicate; the turn stored or held first is kept
            await self.dead_letters.send(raw, key, partition, offset, bad=bad, turn_seq=event.turn_seq)
            outcome = TurnOutcome(TurnStatus.DEAD_LETTERED, cid, reason=bad.reason.value)
        # Counted once stored, held or dead-lettered (a redelivery after a failed drain counts as a duplicate).
        metrics.record_turn(_METRIC_STATUS.get(outcome.status, outcome.status.value), outcome.reason)
        if outcome.status is TurnStatus.APPENDED:
            if outcome.next_held is not False:  # the append said whether one waits: no round trip
                await self._drain_pending(cid, event.turn_seq)
        else:
            # A duplicate may be the redelivery after a crash between an append and its
            # drain; a turn just held may have met a gap that another worker filled after
            # we read (a rebalance overlap). Either way the next turn may be held in vain.
            await self._drain_pending(cid, (await self.store.meta(cid)).last_seq)
        return outcome

    def parse(self, raw: bytes, key: bytes | None) -> TurnEvent:
        """Decode and validate an event, or raise BadEventError with the reason."""
        limit = self.settings.kafka.max_event_bytes
        if len(raw) > limit:
            raise BadEventError(DeadLetterReason.OVERSIZED, f"{len(raw)} bytes, over the {limit}-byte limit")
        try:
            # Strict, as the published JSON Schema is: "turn_seq": "3" or true is not an integer.
            # Only JSON-mode strictness takes UUIDs, datetimes and enums as the strings they
            # are in JSON. Parsed once: a good event never goes through json.loads.
            event = TurnEvent.model_validate_json(raw, strict=True)
        except ValidationError as e:
            raise _refusal(raw, e) from e
        if b"NaN" in raw or b"Infinity" in raw:
            # pydantic's parser takes these constants in free-form fields; they are not JSON
            # and would reach the provider in the stored history. Rare: checked only then.
            _loads(raw)
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
        """Append, hold or recognise a redelivery; raises BadEventError for a conflicting duplicate."""
        cid = event.conversation_id
        fingerprint = turn_fingerprint(event)
        while True:
            meta = await self.store.meta(cid)
            if event.turn_seq <= meta.last_seq:
                stored = await self.store.fingerprint(cid, event.turn_seq)
                # A turn stored before fingerprints were kept has none: its redeliveries are
                # accepted as duplicates, as every redelivery was then.
                if stored is not None and stored != fingerprint:
                    raise conflicting_duplicate(cid, event.turn_seq, fingerprint, stored)
                # A redelivery: the request it carried was recorded with the append; make
                # sure it is indexed (the crash may have come between the two writes).
                if await self.jobs.ensure_due(cid):
                    self.on_scheduled(cid)
                scheduled = await self._check_threshold(cid, meta)
                return TurnOutcome(TurnStatus.DUPLICATE, cid, scheduled)
            if event.turn_seq > meta.last_seq + 1:
                if not await self.gaps.hold(cid, event.turn_seq, raw, fingerprint=fingerprint):
                    held = await self.gaps.held_turn(cid, event.turn_seq)
                    if held is None:
                        continue  # released or expired since the hold was refused: look again
                    _check_held(event, fingerprint, held)
                log.info("turn %s of %s waits for turn %s", event.turn_seq, cid, meta.last_seq + 1)
                return TurnOutcome(TurnStatus.BUFFERED, cid)
            request = _request_of(event)
            with tracing.span(tracing.APPEND_SPAN) as span:
                appended = await self._append(event, meta, request, fingerprint)
                span.set_attribute("compaction.append.status", appended.status.value)
            if appended.status is AppendStatus.APPENDED:
                break
            if appended.status is AppendStatus.CONFLICTING_HELD:
                held = await self.gaps.held_turn(cid, event.turn_seq)
                if held is not None:
                    _check_held(event, fingerprint, held)
            # "conflict": another writer appended meanwhile (a rebalance overlap); read again.
            # A duplicate, conflicting or not, is told apart by the first branch.
        if request is not None:
            await self.jobs.mark_due(cid)
            self.on_scheduled(cid)
            log.info("compaction of %s requested (%s)", cid, request.trigger.value)
            return TurnOutcome(TurnStatus.APPENDED, cid, request.trigger, next_held=appended.next_held)
        # The append returns the meta it left: no second read.
        after = appended.meta if appended.meta is not None else await self.store.meta(cid)
        scheduled = await self._check_threshold(cid, after)
        return TurnOutcome(TurnStatus.APPENDED, cid, scheduled, next_held=appended.next_held)

    async def _append(
        self, event: TurnEvent, meta: Meta, request: JobRequest | None, fingerprint: str
    ) -> AppendResult:
        settings = self.settings.budget
        counter = counter_for(event.model, settings)
        new = [NewMessage(d, counter.message(d)) for d in (m.to_dict() for m in event.messages)]
        reactive = request is not None and request.trigger is Trigger.REACTIVE
        overflow = (
            detect_overflow(request.error) if request is not None and reactive and request.error else None
        )
        # A maximum the provider stated caps the window from now on, not only for this compaction.
        stated = [w for w in (meta.observed_window, overflow.max_tokens if overflow else None) if w]
        info, budget = budget_for(
            event.model,
            settings,
            event.context_window or meta.context_window,
            event.max_output_tokens or meta.max_output_tokens,
            min(stated, default=None),
        )
        fields: dict[str, str | int | float] = {
            "model": event.model,
            "window": budget.window,
            "threshold": budget.threshold,
            "overhead_tokens": settings.conversation_overhead_tokens,
        }
        if info.source == "fallback" and event.model != meta.model:
            # Once per conversation (its first turn, then each change of model), from what
            # the metadata already holds: per turn would flood the log, per process would
            # name the model only in the first of its conversations.
            log.warning(
                "%s: model %r has no known context window; assuming %d tokens "
                "(set the turn's context_window or budget.window_overrides)",
                event.conversation_id,
                event.model,
                info.window,
            )
        if info.source == "provider" and info.window != meta.observed_window:
            fields["observed_window"] = info.window
            log.warning(
                "%s: the provider's maximum, %s tokens, is now its window", event.conversation_id, info.window
            )
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
        if request is not None and reactive:
            # The provider's count of the rejected prompt is a usage report too; the job
            # keeps the estimate it is paired with, for the compaction to use (_reactive).
            request = replace(request, estimate=estimate)
            if overflow is not None and overflow.actual_tokens:
                calibration = calibrate(calibration, estimate, overflow.actual_tokens)
        if calibration != meta.calibration:
            fields["calibration"] = calibration
        return await self.store.append_turn(
            event.conversation_id,
            event.turn_seq,
            new,
            fields,
            expected_count=meta.msg_count,
            request=request,
            fingerprint=fingerprint,
        )

    async def _check_threshold(self, cid: str, meta: Meta) -> Trigger | None:
        with tracing.span(tracing.BUDGET_SPAN) as span:
            trigger = self.threshold_trigger(meta)
            if trigger is None:
                return None
            span.set_attribute("compaction.trigger", trigger.value)
            # The compaction continues this trace (jobs.py keeps the context with the request).
            scheduled = await self.jobs.schedule(cid, trigger, traceparent=tracing.current_traceparent())
        if scheduled:
            log.info("compaction of %s scheduled (%s)", cid, trigger.value)
        self.on_scheduled(cid)
        return trigger

    def threshold_trigger(self, meta: Meta) -> Trigger | None:
        """The threshold a conversation's estimated total has crossed, if any."""
        return threshold_trigger(meta, self.settings.budget, time.time())

    async def _drain_pending(self, cid: str, seq: int) -> None:
        """Apply, in order, turns that were held behind a gap this turn just filled."""
        released = 0
        while (held := await self.gaps.held_turn(cid, seq + 1)) is not None:
            released += 1
            outcome = await self.handle_held(held.raw, cid, seq + 1)
            if outcome.status is not TurnStatus.APPENDED or outcome.next_held is False:
                break
            seq += 1
        if released:
            await self.gaps.reindex(cid)  # out of the gap index once nothing is held

    async def handle_held(self, raw: bytes, cid: str, turn_seq: int) -> TurnOutcome:
        """Apply one held turn (it was valid when it was held)."""
        try:
            return await self._apply(self.parse(raw, cid.encode()), raw)
        except BadEventError as bad:  # settings changed since it was held, or its seq was stored meanwhile
            await self.dead_letters.held(raw, cid, turn_seq, bad)
            # Left held, it would block its conversation and be dead-lettered again on expiry.
            await self.gaps.drop(cid, turn_seq)
            return TurnOutcome(TurnStatus.DEAD_LETTERED, cid, reason=bad.reason.value)


def threshold_trigger(meta: Meta, settings: BudgetSettings, now: float) -> Trigger | None:
    """The threshold a conversation's estimated total has crossed at ``now``, if any (replay uses it too)."""
    if not settings.auto_compact:
        return None  # manual and reactive requests travel with their turns, not through here
    if meta.retry_after and now < meta.retry_after:
        return None
    _, budget = conversation_budget(meta, settings)
    total = int(meta.total_tokens * meta.calibration)
    regrowth = int(settings.noop_regrowth_fraction * budget.available)
    if meta.noop_tokens and total <= meta.noop_tokens + regrowth:
        return None  # the last attempt could not shrink this; wait for real growth
    if total >= budget.threshold:
        return Trigger.THRESHOLD
    if budget.soft_threshold is not None and total >= budget.soft_threshold:
        return Trigger.SOFT_THRESHOLD
    return None


_IDENTITY = frozenset({"event_id", "timestamp", "schema_version"})


def turn_fingerprint(event: TurnEvent) -> str:
    """A digest of a turn's content: equal for every delivery of one turn, whatever its event id.

    The event's identity (id, timestamp, schema version) is left out, so a runtime that
    publishes a turn again under a new id sends the same turn. Fields at their defaults are
    left out too, so a field added to the schema later keeps stored turns' fingerprints.
    """
    content = event.model_dump(mode="json", exclude=set(_IDENTITY), exclude_defaults=True)
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _check_held(event: TurnEvent, fingerprint: str, held: HeldTurn) -> None:
    """Raise for a turn whose seq is held behind a gap with other content (held first, it is kept)."""
    # A turn held before fingerprints were kept has none: accepted as a duplicate.
    if held.fingerprint is not None and held.fingerprint != fingerprint:
        raise conflicting_duplicate(
            event.conversation_id, event.turn_seq, fingerprint, held.fingerprint, held=True
        )


def _request_of(event: TurnEvent) -> JobRequest | None:
    if event.compaction is None:
        return None
    trigger = Trigger.MANUAL if event.compaction.mode is CompactionMode.FORCE else Trigger.REACTIVE
    return JobRequest(trigger, event.compaction.error, traceparent=tracing.current_traceparent())


def _input_part(new: Sequence[NewMessage], event: TurnEvent) -> int:
    """Tokens of this turn's messages that were input to the call its usage reports."""
    last_assistant = max((i for i, m in enumerate(event.messages) if m.role == "assistant"), default=len(new))
    return sum(m.tokens for m in new[:last_assistant])


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _loads(raw: bytes) -> object:
    """The JSON value, or BadEventError (malformed) for text that is not strict UTF-8 JSON."""
    try:
        # UTF-8 only (json.loads would take UTF-16 and UTF-32 too); no NaN or Infinity.
        # Nesting too deep for Python's parser is a RecursionError; pydantic's parser
        # stops earlier, at a depth its serializer can still write back.
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadEventError(DeadLetterReason.MALFORMED_JSON, str(e) or type(e).__name__) from e


def _refusal(raw: bytes, error: ValidationError) -> BadEventError:
    """Why pydantic refused an event: malformed JSON first (as json.loads tells), else the schema."""
    data = _loads(raw)
    conversation_id = data.get("conversation_id") if isinstance(data, dict) else None
    cid = conversation_id if isinstance(conversation_id, str) else None
    # Text json.loads accepts but pydantic's parser refuses: a lone UTF-16 surrogate
    # escape, or nesting over its depth limit.
    unparsable = any(item["type"] == "json_invalid" for item in error.errors())
    reason = DeadLetterReason.MALFORMED_JSON if unparsable else DeadLetterReason.SCHEMA_VIOLATION
    return BadEventError(reason, _validation_summary(error), None if unparsable else cid)


def _validation_summary(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:10]:
        where = ".".join(str(p) for p in item["loc"]) or "event"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - 10
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
