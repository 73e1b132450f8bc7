"""The dead-letter topic: bad events go there with their original bytes and a reason.

An event that names its conversation and turn seq is also recorded for the runtime that
published it (state/refusals.py), before the record is published: ``Client.wait_for`` learns of
it in O(1), and a client the record wakes finds the rejection stored.
"""

from __future__ import annotations

import base64
import json
import logging

from pydantic import TypeAdapter, ValidationError
from redis import exceptions as redis_errors

from compaction_worker.contracts.events import BadEventError, ConversationId, DeadLetter, Publish
from compaction_worker.settings import TopicSettings
from compaction_worker.state.refusals import Refusals, rejection
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)

_CONVERSATION_ID: TypeAdapter[str] = TypeAdapter(ConversationId)

DLQ_RECORD_LIMIT = 1_000_000
"""Bytes one dead-letter record (key and value) stays under: Kafka's default limit for a record
is 1 MiB (producer max.request.size, broker message.max.bytes), less room for headers. The
original travels as base64 (4/3 of its size), so a bad event over ~745 KB would not fit whole;
a record that cannot be published would send its event back forever and stall the partition."""


class DeadLetters:
    """Publishes dead-letter records for the turn handler and the gap index."""

    def __init__(self, topics: TopicSettings, publish: Publish, store: Store) -> None:
        self.topics = topics
        self.publish = publish
        self.refusals = Refusals(store)

    async def send(
        self,
        raw: bytes,
        key: bytes | None,
        partition: int | None,
        offset: int | None,
        *,
        bad: BadEventError,
        turn_seq: int | None = None,
    ) -> None:
        """Record the rejection for the runtime when the event names its conversation and seq, then
        publish the original bytes and the reason to the dead-letter topic."""
        event_id, named_seq = _identity(raw, bad.conversation_id)
        turn_seq = turn_seq if turn_seq is not None else named_seq
        if bad.conversation_id is not None and turn_seq is not None:
            await self._record(bad.conversation_id, turn_seq, event_id, bad)
        record = DeadLetter(
            reason=bad.reason,
            detail=bad.detail[:4000],
            conversation_id=bad.conversation_id,
            turn_seq=turn_seq,
            source_topic=self.topics.turns,
            partition=partition,
            offset=offset,
            key_b64=base64.b64encode(key).decode() if key is not None else None,
            original_b64=base64.b64encode(raw).decode(),
            original_size=len(raw),
        )
        payload = record.wire()
        if len(payload) + len(key or b"") > DLQ_RECORD_LIMIT:
            payload = _cut_original(record, raw, key).wire()
        log.warning("dead-lettered an event: %s", bad)
        await self.publish(self.topics.dlq, payload, key)

    async def _record(self, cid: str, turn_seq: int, event_id: str | None, bad: BadEventError) -> None:
        """The rejection, where the runtime reads it; an outage propagates (the event comes back), a
        refused write is logged (the dead letter is published all the same)."""
        try:
            await self.refusals.rejected(cid, turn_seq, rejection(bad.reason.value, bad.detail, event_id))
        except redis_errors.ResponseError as e:
            log.warning("the rejection of turn %s was not recorded: %s", turn_seq, e)

    async def held(self, raw: bytes, conversation_id: str, turn_seq: int, bad: BadEventError) -> None:
        """Dead-letter a turn that was held behind a gap, keyed by its conversation."""
        # Held turns were keyed by their conversation (or not keyed: parse allows that); the
        # record is keyed by it either way, so it lands beside the conversation's other letters.
        await self.send(raw, conversation_id.encode(), None, None, bad=bad, turn_seq=turn_seq)


def _identity(raw: bytes, conversation_id: str | None) -> tuple[str | None, int | None]:
    """The event id and turn seq the bad event names, when it is a JSON object of conversation
    ``conversation_id`` (an event of another conversation, or none, names none of its turns)."""
    if conversation_id is None:
        return None, None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict) or data.get("conversation_id") != conversation_id:
        return None, None
    try:  # an id the schema refuses (a hash tag, a control character) owns no keys
        _CONVERSATION_ID.validate_python(conversation_id)
    except ValidationError:
        return None, None
    seq, event_id = data.get("turn_seq"), data.get("event_id")
    return (
        event_id if isinstance(event_id, str) else None,
        seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1 else None,
    )


def _cut_original(record: DeadLetter, raw: bytes, key: bytes | None) -> DeadLetter:
    """The record with as much of the original as fits in one Kafka record, saying how much."""
    bare = len(record.model_copy(update={"original_b64": ""}).wire())
    room = DLQ_RECORD_LIMIT - bare - len(key or b"") - 200  # 200: the note below
    keep = max(0, room) // 4 * 3
    note = (
        f" (the record keeps the first {keep} of {len(raw)} bytes; the whole would not fit in a Kafka record)"
    )
    return record.model_copy(
        update={"original_b64": base64.b64encode(raw[:keep]).decode(), "detail": record.detail + note}
    )
