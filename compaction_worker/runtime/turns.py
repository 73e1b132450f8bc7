"""The per-turn path in four steps: parse, decide (conversation/decide.py), apply (one script call
that stores, holds or recognises the turn: conversation/apply.py), act on its verdict.

It never waits on an LLM: compactions run later, from the job queue (compactor.py), and pins a
turn asks for are stored with it and applied by the next holder of the lock (pins.py).
Consecutive turns of one conversation in a batch are stored together by runs.py, with the same
decision, the same script call (a single turn is a run of one) and the same action on an append
(:meth:`TurnHandler.appended`); what a run does not store comes here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from aiokafka.errors import KafkaError
from pydantic import ValidationError
from redis import exceptions as redis_errors

from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.events import (
    BadEventError,
    DeadLetterReason,
    Trigger,
    TurnEvent,
    validation_summary,
)
from compaction_worker.conversation.apply import AppendReply, Appends, AppendStatus
from compaction_worker.conversation.decide import Counted, Planned, decide
from compaction_worker.conversation.meta import Meta
from compaction_worker.errors import ConcurrentUpdateError
from compaction_worker.observability import metrics, tracing
from compaction_worker.observability.logs import bound
from compaction_worker.runtime.deadletters import DeadLetters
from compaction_worker.settings import Settings
from compaction_worker.state.gaps import GapIndex, conflicting_duplicate

log = logging.getLogger(__name__)


class TurnStatus(StrEnum):
    """What the per-turn path did with one input event."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    BUFFERED = "buffered"
    DEAD_LETTERED = "dead_lettered"


# The turns metric's word for a turn held behind a gap.
_METRIC_STATUS = {TurnStatus.BUFFERED: "held"}

STALE_TRIES = 3
"""Script calls a turn may take when other writers keep changing its conversation's meta (each
decided again at once on the meta the script answered with: nothing failed, so no wait)."""
KNOWN_CONVERSATIONS = 4096
"""How many conversations' meta a handler remembers (the least recently served are forgotten)."""


OUTAGES: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    # A Redis Cluster in failover: slots unserved or moving, a primary down.
    redis_errors.ClusterError,
    redis_errors.RedisClusterException,
    redis_errors.TryAgainError,
    OSError,
    KafkaError,
    ConcurrentUpdateError,
)
"""Errors that mean "the infrastructure is away or busy", not "this event is bad"."""


def is_outage(error: BaseException) -> bool:
    """Whether a failure is an outage: the infrastructure is away, not the event at fault.

    An outage brings its turn back until the infrastructure returns, without limit; any other
    failure is a bug or a poison turn, tried ``retry.turns`` times and then dead-lettered, so
    that one turn cannot stall its partition (:meth:`TurnHandler.handle`).
    """
    return isinstance(error, OUTAGES)


@dataclass(slots=True)
class TurnOutcome:
    """The result of handling one input event."""

    status: TurnStatus
    conversation_id: str | None = None
    scheduled: Trigger | None = None
    reason: str | None = None
    next_held: bool = False
    """After an append, whether the next turn is held behind a gap; after a duplicate, whether the one after the last stored is."""
    last_seq: int = 0
    """The conversation's last stored seq (this turn's, after an append)."""


class TurnHandler:
    """Stores one ``conversation.turn`` event in four steps: parse, decide, apply, act.

    It remembers the meta of the conversations it served last (their turns come to this
    consumer in a row): a turn is decided on it (conversation/decide.py) and stored by one
    script call that checks the meta's revision (conversation/apply.py). A miss, or a meta
    another writer changed, costs one more call, decided again on the meta the script answered
    with, never a wrong write.
    """

    def __init__(
        self,
        settings: Settings,
        appends: Appends,
        gaps: GapIndex,
        dead_letters: DeadLetters,
        *,
        on_scheduled: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.appends = appends
        self.gaps = gaps
        self.dead_letters = dead_letters
        self.on_scheduled = on_scheduled or (lambda _cid: None)
        self.policy = settings.retry.turns
        self._known: OrderedDict[str, Meta] = OrderedDict()
        self.failed_in_run: dict[bytes, int] = {}
        """Turns (their bytes) whose decision failed in a run: that was their first try (runs.py)."""

    async def handle(
        self, raw: bytes, key: bytes | None = None, partition: int | None = None, offset: int | None = None
    ) -> TurnOutcome:
        """Handle one event; bad input becomes a dead-letter record, never an exception.

        An outage (:func:`is_outage`) propagates: the caller must not acknowledge the event,
        so that it is redelivered once Redis or the broker is back. Any other failure is tried
        again, ``retry.turns`` tries in all, then the turn goes to the DLQ as
        ``processing_failed``: a poison turn cannot stall its partition.
        """
        where = _Where(raw, key, partition, offset)
        event: TurnEvent | None = None
        with contextlib.suppress(Exception):  # a bad event is parsed again by each try, and dead-lettered
            event = self.parse(raw, key)
        # Every line logged for the turn names it (a bad event: the conversation its key names).
        with bound(
            conversation_id=event.conversation_id if event else key.decode(errors="replace") if key else None,
            turn_seq=event.turn_seq if event else None,
        ):
            outcome = await self._tried(
                lambda: self._turn(where, event),
                lambda error, tries: self._poisoned(where, error=error, tries=tries),
                self.failed_in_run.pop(raw, 0) if self.failed_in_run else 0,
            )
        # Counted once stored, held or dead-lettered (a redelivery after a failed drain counts as a duplicate).
        metrics.record_turn(_METRIC_STATUS.get(outcome.status, outcome.status.value), outcome.reason)
        return outcome

    async def _turn(self, where: _Where, parsed: TurnEvent | None) -> TurnOutcome:
        """Parse (unless ``parsed``), decide and apply, act; a bad event, or a conflicting duplicate, is dead-lettered."""
        try:
            event = parsed or self.parse(where.raw, where.key)
        except BadEventError as bad:
            await self.dead_letters.send(*where, bad=bad)
            return TurnOutcome(TurnStatus.DEAD_LETTERED, bad.conversation_id, reason=bad.reason.value)
        try:
            outcome = await self._act(*await self._stored(event, where.raw))
        except BadEventError as bad:  # a conflicting duplicate; the turn stored or held first is kept
            await self.dead_letters.send(*where, bad=bad, turn_seq=event.turn_seq)
            # The turn held first may be the next one (held by a worker that saw the gap
            # before this one saw the turn before it): it applies now.
            outcome = TurnOutcome(
                TurnStatus.DEAD_LETTERED,
                event.conversation_id,
                reason=bad.reason.value,
                next_held=True,
                last_seq=event.turn_seq - 1,
            )
        if outcome.next_held:  # the script said whether the turn after it waits: no round trip
            await self.drain_pending(event.conversation_id, outcome.last_seq)
        return outcome

    async def _stored(self, event: TurnEvent, raw: bytes) -> tuple[Planned, AppendReply]:
        """Decide the turn on the meta known, and apply it; decided again on the meta the script
        answered with when it was stale, or with its held form when it is ahead of a gap the
        handler did not expect (:data:`STALE_TRIES` calls in all; then ConcurrentUpdateError)."""
        cid, seq = event.conversation_id, event.turn_seq
        known = self._known.get(cid)
        # A first turn is never ahead of a gap; a later one may be, if the handler knows no meta.
        hold = (raw, int(time.time() * 1000)) if seq > (known.last_seq + 1 if known else 1) else None
        counts: dict[str, Counted] = {}  # counted once, whatever meta each try is decided on
        for _ in range(STALE_TRIES):
            with tracing.span(tracing.BUDGET_SPAN) as span:
                # The job's compaction continues this span's trace (its request keeps the context).
                turn = decide(known, event, self.settings, hold=hold, counts=counts)
                if turn.plan.job is not None:
                    span.set_attribute("compaction.trigger", turn.plan.job.trigger.value)
            with tracing.span(tracing.APPEND_SPAN) as span:
                (reply,) = await self.appends.apply(cid, [turn.write])  # a run of one
                span.set_attribute("compaction.append.status", reply.status.value)
            if reply.status is AppendStatus.STALE and reply.meta is not None:
                known = reply.meta
                self.remember(cid, known)
            elif reply.status is AppendStatus.NEED_HELD:
                hold = (raw, int(time.time() * 1000))
            else:
                return turn, reply
        raise ConcurrentUpdateError(
            f"{cid}: the meta changed under every one of {STALE_TRIES} tries of turn {seq}"
        )

    async def _act(self, turn: Planned, reply: AppendReply) -> TurnOutcome:
        """What the script's verdict on a turn asks of the worker."""
        cid, seq = turn.event.conversation_id, turn.event.turn_seq
        match reply.status:
            case AppendStatus.APPENDED:
                return self.appended(turn, reply)
            case AppendStatus.DUPLICATE:  # its job was indexed again (apply.py): wake the pool for it
                if reply.job:
                    self.on_scheduled(cid)
                return TurnOutcome(
                    TurnStatus.DUPLICATE, cid, next_held=reply.next_held, last_seq=reply.last_seq
                )
            case AppendStatus.HELD:
                # After the hash, on every delivery: a crash between the two is repaired by the redelivery.
                await self.gaps.indexed(cid, turn.held_ms or int(time.time() * 1000))
                log.info("turn %s of %s waits for turn %s", seq, cid, reply.last_seq + 1)
                return TurnOutcome(TurnStatus.BUFFERED, cid, last_seq=reply.last_seq)
        held = reply.status is AppendStatus.CONFLICTING_HELD
        raise conflicting_duplicate(cid, seq, turn.write.fingerprint, reply.kept or "", held=held)

    def appended(self, turn: Planned, reply: AppendReply) -> TurnOutcome:
        """A turn stored (alone, or in a run): its meta remembered, its job's pool woken."""
        cid, plan = turn.event.conversation_id, turn.plan
        self.remember(cid, plan.after)
        for note in plan.notes:
            log.warning("%s", note)
        trigger = plan.job.trigger if plan.job is not None else None
        if plan.due:
            log.info("compaction of %s requested (%s)", cid, trigger.value if trigger else "")
        if trigger is not None:
            self.on_scheduled(cid)
        return TurnOutcome(
            TurnStatus.APPENDED, cid, trigger, next_held=reply.next_held, last_seq=reply.last_seq
        )

    async def _tried(
        self,
        call: Callable[[], Awaitable[TurnOutcome]],
        poisoned: Callable[[Exception, int], Awaitable[TurnOutcome]],
        failures: int = 0,
    ) -> TurnOutcome:
        """``call()`` until it returns; an outage propagates; any other failure is tried again
        (``retry.turns``), and after the last try the turn is ``poisoned(error, tries)``.
        ``failures``: tries the turn already failed (in a run: runs.py)."""
        if not failures:
            try:
                return await call()  # the common case: the retry driver is entered only on a failure
            except Exception as error:
                if is_outage(error):
                    raise
                failures = 1
                if self.policy.exhausted(failures):
                    return await poisoned(error, failures)
                self._retrying(error, failures)
        try:
            return await self.policy.run(
                call, retry_if=lambda error: not is_outage(error), failures=failures, on_retry=self._retrying
            )
        except Exception as error:
            if is_outage(error):
                raise
            return await poisoned(error, max(self.policy.attempts, failures + 1))

    def _retrying(self, error: BaseException, failures: int) -> None:
        log.warning(
            "turn failed (%s: %s); try %d of %d",
            type(error).__name__,
            error,
            failures + 1,
            self.policy.attempts,
            exc_info=error,
        )

    async def _poisoned(self, where: _Where, *, error: Exception, tries: int) -> TurnOutcome:
        log.error("a turn failed %d times; dead-lettered as processing_failed", tries, exc_info=error)
        bad = BadEventError(
            DeadLetterReason.PROCESSING_FAILED,
            f"{type(error).__name__}: {error} (failed {tries} times)",
            where.key.decode(errors="replace") if where.key else None,
        )
        await self.dead_letters.send(*where, bad=bad)
        return TurnOutcome(TurnStatus.DEAD_LETTERED, bad.conversation_id, reason=bad.reason.value)

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
        if event.profile and event.profile not in self.settings.profiles:
            known = ", ".join(sorted(self.settings.profiles)) or "none"
            raise BadEventError(
                DeadLetterReason.UNKNOWN_PROFILE,
                f"profile {event.profile!r} is not one of the deployment's profiles ({known})",
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

    def known(self, cid: str) -> Meta | None:
        """The meta this handler last stored or read for the conversation, if it remembers it."""
        return self._known.get(cid)

    def remember(self, cid: str, meta: Meta) -> None:
        self._known[cid] = meta
        self._known.move_to_end(cid)
        if len(self._known) > KNOWN_CONVERSATIONS:
            self._known.popitem(last=False)

    async def drain_pending(self, cid: str, seq: int) -> None:
        """Apply, in order, turns that were held behind a gap this turn just filled."""
        released = 0
        while (held := await self.gaps.held_turn(cid, seq + 1)) is not None:
            released += 1
            outcome = await self.handle_held(held.raw, cid, seq + 1)
            if outcome.status is not TurnStatus.APPENDED or not outcome.next_held:
                break
            seq += 1
        if released:
            await self.gaps.reindex(cid)  # out of the gap index once nothing is held

    async def handle_held(self, raw: bytes, cid: str, turn_seq: int) -> TurnOutcome:
        """Apply one held turn (it was valid when it was held); one that keeps failing is dead-lettered."""

        async def apply() -> TurnOutcome:
            try:
                with bound(conversation_id=cid, turn_seq=turn_seq):
                    return await self._act(*await self._stored(self.parse(raw, cid.encode()), raw))
            except (
                BadEventError
            ) as bad:  # settings changed since it was held, or its seq was stored meanwhile
                return await self._release_held(raw, cid, turn_seq, bad)

        async def poisoned(error: Exception, tries: int) -> TurnOutcome:
            log.error("held turn %s of %s failed %d times", turn_seq, cid, tries, exc_info=error)
            detail = f"{type(error).__name__}: {error} (failed {tries} times)"
            return await self._release_held(
                raw, cid, turn_seq, BadEventError(DeadLetterReason.PROCESSING_FAILED, detail, cid)
            )

        return await self._tried(apply, poisoned)

    async def _release_held(self, raw: bytes, cid: str, turn_seq: int, bad: BadEventError) -> TurnOutcome:
        await self.dead_letters.held(raw, cid, turn_seq, bad)
        # Left held, it would block its conversation and be dead-lettered again on expiry.
        await self.gaps.drop(cid, turn_seq)
        return TurnOutcome(TurnStatus.DEAD_LETTERED, cid, reason=bad.reason.value)


class _Where(NamedTuple):
    """Where an event came from, as the DLQ records it."""

    raw: bytes
    key: bytes | None
    partition: int | None
    offset: int | None


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
    return BadEventError(reason, validation_summary(error), None if unparsable else cid)
