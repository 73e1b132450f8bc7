"""What every adapter shares: the private ``native`` field, validation, image data URLs.

An adapter maps one unit of its format (a message, a content block, a group of items)
to one stored OpenAI chat message. When mapping the message back would not give the
unit again (a block type chat has no place for, an extra field, a role chat lacks), the
unit itself is kept under the private field ``native``, and mapping back restores it as
long as the stored message still is what the unit maps to; a message a compaction edited
is mapped from its new content instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from compaction_worker.contracts.events import ChatMessage
from compaction_worker.contracts.history import public_message
from compaction_worker.errors import CompactionWorkerError

NATIVE = "native"
"""The private field of a stored message that keeps what chat form cannot hold (one of
``PRIVATE_FIELDS``: rendering strips it and token counts skip it)."""

Unit = TypeVar("Unit")
Message = dict[str, Any]


class FormatError(CompactionWorkerError, ValueError):
    """A payload that is not what its format allows, or that chat form cannot hold."""


def validated(message: Mapping[str, Any], where: str) -> Message:
    """``message`` checked against the stored message's contract (a plain copy, unchanged)."""
    try:
        ChatMessage.model_validate(message)
    except ValidationError as e:
        raise FormatError(f"{where}: not a valid chat message: {e.errors()[0]['msg']}") from e
    return copy.deepcopy(dict(message))


def _comparable(message: Mapping[str, Any]) -> Message:
    """A message as the worker stores it, without private fields: what equality means here."""
    return public_message(ChatMessage.model_validate(message).to_dict())


def keep(fmt: str, unit: Unit, message: Message, back: Callable[[Message], Unit]) -> Message:
    """``message`` with ``unit`` kept under ``native`` unless ``back`` already gives ``unit`` again."""
    if back(public_message(message)) != unit:
        message[NATIVE] = {"format": fmt, "source": copy.deepcopy(unit)}
    return message


def restore(
    fmt: str,
    message: Mapping[str, Any],
    forward: Callable[[Any], Message],
    back: Callable[[Message], Unit],
) -> Unit:
    """The unit ``message`` came from: the kept one while it still maps to ``message``, else ``back``."""
    plain = public_message(message)
    native = message.get(NATIVE)
    if isinstance(native, Mapping) and native.get("format") == fmt and "source" in native:
        source = native["source"]
        try:
            if _comparable(forward(source)) == _comparable(plain):
                return copy.deepcopy(source)  # type: ignore[no-any-return]  # the unit kept by keep()
        except (FormatError, ValidationError):
            pass  # a kept unit this version cannot read: map the message itself
    return back(plain)


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def split_data_url(url: str) -> tuple[str, str] | None:
    """``(media_type, base64 data)`` of a base64 data URL, or None for any other URL."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return head, data


def text_part(text: str) -> Message:
    return {"type": "text", "text": text}


def tool_call(call_id: str | None, name: str | None, arguments: str | None) -> Message:
    """A chat tool call of function ``name`` with its JSON-encoded ``arguments``."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(content: str | list[Message], calls: list[Message]) -> Message:
    """A chat assistant message; its ``content`` is left out when empty and ``calls`` carry the turn."""
    out: Message = {"role": "assistant"}
    if content or not calls:
        out["content"] = content
    if calls:
        out["tool_calls"] = calls
    return out


def call_arguments(raw: Any) -> dict[str, Any]:
    """A chat tool call's ``arguments`` as the JSON object a native format takes: the object it
    encodes, or the raw text under ``arguments`` when it encodes none."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": raw}
