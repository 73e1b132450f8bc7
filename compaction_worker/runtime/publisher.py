"""The outbound edge: a publisher sends one event to a topic, keyed by conversation."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel


class Publisher(Protocol):
    """Sends one event to a topic, keyed (the worker's broker, or a test double)."""

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None: ...


def encode(event: BaseModel) -> bytes:
    """An event's wire form: its JSON."""
    return event.model_dump_json().encode()
