"""What the worker refused of a turn, where the runtime that published it reads it by seq.

The dead-letter topic is the operator's record of a refused event; this is the runtime's: a hash
beside the conversation's other keys (conversation/keys.py, ``refused``), one field per turn seq
holding the latest event with that seq the worker dead-lettered, and a field ``<seq>:asks``
holding, a line each, the pins and unpins that turn asked for and that could not be applied.
``Client.wait_for(receipt)`` reads both in the round trip that reads the conversation's status
(conversation/status.py): O(1). They are written only when something is refused, never on an
ordinary append, and expire with the conversation (its deadline, else the retention from now).

An event that names no conversation and seq (not JSON, oversized, neither field readable) cannot
be recorded: the dead-letter topic alone has it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from compaction_worker.state.scripts import Script, as_text
from compaction_worker.state.store import Store

DETAIL_LIMIT = 4000
"""Characters of a refusal's detail kept (as the dead-letter record keeps)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """An event with a turn's seq that the worker dead-lettered: nothing of it was stored."""

    reason: str
    """The dead letter's reason (``DeadLetterReason``)."""
    detail: str
    event_id: str | None
    """The refused event's ``event_id``: which of the events with this seq it was."""
    at_ms: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Rejection:
        data = json.loads(raw)
        return cls(str(data["reason"]), str(data["detail"]), data.get("event_id"), int(data.get("at_ms", 0)))


def asks_field(turn_seq: int) -> str:
    """The field of the pins turn ``turn_seq`` asked for that were not applied."""
    return f"{turn_seq}:asks"


def not_applied_of(raw: str | bytes | None) -> tuple[str, ...]:
    """The lines of an asks field (none when it is absent)."""
    return tuple(as_text(raw).split("\n")) if raw else ()


class Refusals:
    """Writes the ``refused`` hash of a conversation (reads go with its status: conversation/status.py)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._write = Script(store.redis, "expiry.lua", "refusal.lua")

    async def rejected(self, conversation_id: str, turn_seq: int, rejection: Rejection) -> None:
        """Record that an event with turn ``turn_seq`` was dead-lettered (the latest such event wins)."""
        await self._record(conversation_id, str(turn_seq), rejection.to_json(), append=False)

    async def not_applied(self, conversation_id: str, turn_seq: int, problem: str) -> None:
        """Record that a pin or unpin turn ``turn_seq`` asked for was not applied, and why."""
        await self._record(conversation_id, asks_field(turn_seq), problem.replace("\n", " "), append=True)

    async def _record(self, conversation_id: str, field: str, value: str, *, append: bool) -> None:
        keys = self.store.keys(conversation_id)
        await self._write(
            [keys.meta, keys.refused],
            field=field,
            value=value,
            append="1" if append else "0",
            now_ms=str(int(time.time() * 1000)),
            retention_ms=str(self.store.retention_ms),
        )


def rejection(reason: str, detail: str, event_id: str | None) -> Rejection:
    """A rejection recorded now, its detail cut to :data:`DETAIL_LIMIT`."""
    return Rejection(reason, detail[:DETAIL_LIMIT], event_id, int(time.time() * 1000))
