"""The dead-letter topic: bad events go there with their original bytes and a reason."""

from __future__ import annotations

import base64
import logging

from compaction_worker.contracts.events import BadEventError, DeadLetter, Publish
from compaction_worker.settings import TopicSettings

log = logging.getLogger(__name__)

DLQ_RECORD_LIMIT = 1_000_000
"""Bytes one dead-letter record (key and value) stays under: Kafka's default limit for a record
is 1 MiB (producer max.request.size, broker message.max.bytes), less room for headers. The
original travels as base64 (4/3 of its size), so a bad event over ~745 KB would not fit whole;
a record that cannot be published would send its event back forever and stall the partition."""


class DeadLetters:
    """Publishes dead-letter records for the turn handler and the gap index."""

    def __init__(self, topics: TopicSettings, publish: Publish) -> None:
        self.topics = topics
        self.publish = publish

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
        """Publish the original bytes and the reason to the dead-letter topic."""
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

    async def held(self, raw: bytes, conversation_id: str, turn_seq: int, bad: BadEventError) -> None:
        """Dead-letter a turn that was held behind a gap, keyed by its conversation."""
        # Held turns were keyed by their conversation (or not keyed: parse allows that); the
        # record is keyed by it either way, so it lands beside the conversation's other letters.
        await self.send(raw, conversation_id.encode(), None, None, bad=bad, turn_seq=turn_seq)


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
