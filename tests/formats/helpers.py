"""What every adapter test checks: the stored form is valid, survives JSON, and pairs its tools."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from compaction_worker.contracts.events import ChatMessage
from compaction_worker.contracts.history import public_message
from compaction_worker.contracts.toolpairs import pair_results, unanswered_calls

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def stored(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the worker keeps them: validated, dumped, through JSON."""
    out: list[dict[str, Any]] = json.loads(
        json.dumps([ChatMessage.model_validate(m).to_dict() for m in messages])
    )
    return out


def pairs(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(call id, result's tool_call_id)`` of every answered call; asserts none is left unanswered."""
    assert unanswered_calls(messages) == ()
    return [(call.id, str(messages[i]["tool_call_id"])) for i, call in sorted(pair_results(messages).items())]


def provider_view(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What reaches a provider: no private field."""
    return [public_message(m) for m in messages]
