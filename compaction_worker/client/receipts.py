"""What a runtime holds for each turn it publishes, and what a wait on it answers.

Every ``publish_turn`` and ``request_compaction`` returns a :class:`Receipt`; ``Client.wait_for``
given one returns the :class:`TurnResult` once the turn is stored and what it set off has landed,
or raises :class:`~compaction_worker.errors.TurnRejected` with the reason the worker dead-lettered
it for. The receipt carries the turn's content fingerprint, the one the worker stores with it, so
that a wait tells its own turn from another one stored with the same seq (a conflicting duplicate)
in the same O(1) read that finds a rejection (state/refusals.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from pydantic import ValidationError

from compaction_worker.contracts.events import ContextStatus, DeadLetterReason, TurnEvent
from compaction_worker.conversation.status import TurnRecord
from compaction_worker.errors import TurnRejected

ADVICE: dict[str, str] = {
    DeadLetterReason.CONFLICTING_DUPLICATE: (
        "another turn with this seq is stored; publish this one again under the next seq "
        "(Client.next_turn_seq), and draw every seq of a conversation from one counter (docs/integration.md)"
    ),
    DeadLetterReason.UNKNOWN_PROFILE: "name a profile the settings have, or none, and publish it again with this seq",
    DeadLetterReason.UNKNOWN_MODEL: (
        "set the turn's context_window (or the settings' budget.window_overrides or fallback_window) "
        "and publish it again with this seq"
    ),
    DeadLetterReason.SCHEMA_VIOLATION: (
        "fix the event (schemas/conversation.turn.json) and publish it again with this seq"
    ),
    DeadLetterReason.KEY_MISMATCH: "key the record by its conversation_id and publish it again",
    DeadLetterReason.OVERSIZED: (
        "split its messages over several turns, or raise kafka.max_event_bytes (the worker's and the client's)"
    ),
    DeadLetterReason.SEQUENCE_GAP: (
        "a turn before it never arrived: publish the missing seqs, then this turn again"
    ),
    DeadLetterReason.PROCESSING_FAILED: (
        "the worker failed on it (its log says why); publishing it again with this seq tries it again"
    ),
}
"""What to do about a rejected turn, by the dead letter's reason."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """A turn published: which conversation, which seq, which event; ``Client.wait_for`` takes it."""

    conversation_id: str
    turn_seq: int
    event_id: uuid.UUID | None
    """The published event's id (None: raw bytes that name none; the worker gave it one)."""
    fingerprint: str | None = field(default=None, repr=False)
    """The turn's content fingerprint, as the worker stores it; None when the bytes are no valid turn
    (they can only be rejected)."""
    asks_pins: bool = False
    """The turn asks for pins or unpins: its wait applies them, and reports those it could not."""

    @classmethod
    def of(cls, payload: bytes) -> Receipt | None:
        """The receipt of a turn's bytes as published; None when they name no conversation and seq
        (the worker cannot record their rejection: the dead-letter topic alone has it)."""
        try:
            event = TurnEvent.model_validate_json(payload, strict=True)  # as the worker reads it
        except ValidationError:
            return _named(payload)
        return cls.of_event(event)

    @classmethod
    def of_event(cls, event: TurnEvent) -> Receipt:
        """The receipt of a turn (:meth:`of` reads it from its bytes first, as the worker will)."""
        return cls(
            event.conversation_id,
            event.turn_seq,
            event.event_id,
            event.fingerprint(),
            bool(event.pin or event.unpin),
        )


def _named(payload: bytes) -> Receipt | None:
    """The receipt of bytes that are no valid turn but name a conversation and a seq."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    cid, seq, event_id = data.get("conversation_id"), data.get("turn_seq"), data.get("event_id")
    if not isinstance(cid, str) or not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None
    try:
        named = uuid.UUID(event_id) if isinstance(event_id, str) else None
    except ValueError:
        named = None
    return Receipt(cid, seq, named)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A turn stored, and every compaction it set off landed: what ``Client.wait_for(receipt)`` returns."""

    conversation_id: str
    turn_seq: int
    version: int
    """The effective history's version now."""
    context_status: ContextStatus
    problems: tuple[str, ...] = ()
    """What of the turn's asks was not applied, one sentence each (a pin naming no such message, an
    unpin of a message not pinned); the turn itself is stored all the same."""


def stored(receipt: Receipt, record: TurnRecord) -> bool:
    """Whether the receipt's turn is stored, or raise TurnRejected when the worker dead-lettered it.

    Stored: a turn with its seq and its content is (a turn published again under a new event id is
    the same turn). Rejected: not stored, and the latest event dead-lettered with its seq is this
    one. Neither yet: False (the worker has not read it, or it waits behind a gap).
    """
    if receipt.fingerprint is not None and record.fingerprint == receipt.fingerprint:
        return True
    rejection = record.rejection
    event_id = None if receipt.event_id is None else str(receipt.event_id)
    if rejection is not None and rejection.event_id == event_id:
        raise TurnRejected(
            receipt.conversation_id,
            receipt.turn_seq,
            rejection.reason,
            rejection.detail,
            ADVICE.get(rejection.reason, ""),
        )
    return False


def timed_out(conversation_id: str, version: int | None, receipt: Receipt | None, timeout: float) -> str:
    """What a wait that gave up says: what it waited for, and where to look."""
    if receipt is not None and version is None:
        return (
            f"{conversation_id}: turn {receipt.turn_seq} neither stored with its compactions landed nor "
            f"rejected within {timeout}s (is a worker consuming the turns topic? a turn after a gap waits "
            "for the missing seq, up to worker.gap_timeout_seconds)"
        )
    what = "no pending compaction" if version is None else f"version {version}"
    return f"{conversation_id}: {what} within {timeout}s"
