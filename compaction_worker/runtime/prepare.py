"""What the turn path computes from an event before it plans the append: pure, no I/O.

The compaction request an event carries, its messages as stored with their token counts and
JSON, and its fingerprint made from that JSON; the per-turn path (turns.py) and runs (runs.py) both use them.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.contracts.events import CompactionMode, Trigger, TurnEvent
from compaction_worker.contracts.fingerprints import turn_fingerprint
from compaction_worker.observability import tracing
from compaction_worker.settings import BudgetSettings
from compaction_worker.state.appends import NewMessage
from compaction_worker.state.jobs import JobRequest


def counted(event: TurnEvent, settings: BudgetSettings) -> tuple[TokenCounter, list[NewMessage]]:
    """The counter for the event's model, and its messages as stored, each with its token count
    and its JSON text (encoded once: the stores and the fingerprint take it)."""
    counter = counter_for(event.model, settings)
    new = []
    for message in event.messages:
        data = message.to_dict()
        new.append(NewMessage(data, counter.message(data), message.to_json()))
    return counter, new


def fingerprint_of(event: TurnEvent, new: Sequence[NewMessage]) -> str:
    """The turn's fingerprint, from the JSON texts :func:`counted` made (no second serialization)."""
    return turn_fingerprint(event, [m.text or "" for m in new])


def request_of(event: TurnEvent) -> JobRequest | None:
    if event.compaction is None:
        return None
    trigger = Trigger.MANUAL if event.compaction.mode is CompactionMode.FORCE else Trigger.REACTIVE
    return JobRequest(trigger, event.compaction.error, traceparent=tracing.current_traceparent())
