"""OpenAI chat messages, the stored form itself: validated on the way in, private fields dropped on the way out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from compaction_worker.contracts.history import public_message
from compaction_worker.formats._common import Message, validated


class _Dumpable(Protocol):
    """An SDK object (``openai``'s ``ChatCompletionMessage``, any pydantic model)."""

    def model_dump(self, *, exclude_none: bool) -> dict[str, Any]: ...


def to_openai(messages: Iterable[Mapping[str, Any] | _Dumpable]) -> list[Message]:
    """The messages as stored: plain copies, each checked (:class:`FormatError` names the bad one)."""
    out = []
    for i, message in enumerate(messages):
        plain = message if isinstance(message, Mapping) else message.model_dump(exclude_none=True)
        out.append(validated(plain, f"message {i}"))
    return out


def from_openai(messages: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Stored messages as a provider takes them: without this service's private fields."""
    return [public_message(m) for m in messages]
