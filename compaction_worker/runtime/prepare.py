"""What the turn path computes from an event before it plans the append: pure, no I/O.

The event's fingerprint, the compaction request it carries, and its messages as stored with
their token counts; the per-turn path (turns.py) and runs (runs.py) both use them.
"""

from __future__ import annotations

import hashlib
import json

from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.contracts.events import CompactionMode, Trigger, TurnEvent
from compaction_worker.observability import tracing
from compaction_worker.settings import BudgetSettings
from compaction_worker.state.appends import NewMessage
from compaction_worker.state.jobs import JobRequest


def counted(event: TurnEvent, settings: BudgetSettings) -> tuple[TokenCounter, list[NewMessage]]:
    """The counter for the event's model, and its messages as stored, each with its token count."""
    counter = counter_for(event.model, settings)
    return counter, [NewMessage(d, counter.message(d)) for d in (m.to_dict() for m in event.messages)]


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


def request_of(event: TurnEvent) -> JobRequest | None:
    if event.compaction is None:
        return None
    trigger = Trigger.MANUAL if event.compaction.mode is CompactionMode.FORCE else Trigger.REACTIVE
    return JobRequest(trigger, event.compaction.error, traceparent=tracing.current_traceparent())
