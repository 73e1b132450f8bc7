"""A turn's fingerprint: a digest of its content, equal for every delivery of one turn.

The per-turn script stores it with the turn and compares it on a redelivery: the same seq
with another fingerprint is a conflicting duplicate. The event's identity (id, timestamp,
schema version) is left out, so a runtime that publishes a turn again under a new id sends the
same turn; the event's fields at their defaults are left out too, so a field added to the event
later keeps stored turns' fingerprints.

It hashes the event's other fields' JSON, in the order its model gives them, then each
message's stored JSON (``ChatMessage.to_json``, made once per turn for the stores), so a turn
costs no second serialization.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from compaction_worker.contracts.events import TurnEvent

_IDENTITY = frozenset({"event_id", "timestamp", "schema_version"})
_NOT_MESSAGES = set(_IDENTITY | {"messages"})  # a set, as pydantic's exclude takes it: built once


def turn_fingerprint(event: TurnEvent, messages: Sequence[str] | None = None) -> str:
    """32 hex digits of the turn's content; ``messages``: its messages' ``to_json`` texts, if at hand."""
    texts = messages if messages is not None else [m.to_json() for m in event.messages]
    digest = hashlib.blake2b(
        event.model_dump_json(exclude=_NOT_MESSAGES, exclude_defaults=True).encode(), digest_size=16
    )
    for text in texts:
        digest.update(b"\x1e")
        digest.update(text.encode())
    return digest.hexdigest()
