"""OpenAI Responses API items in and out of the stored form.

A ``message`` item is one chat message (``developer`` becomes ``system``); an assistant
``message`` and the ``function_call`` items after it become one assistant message with
parallel ``tool_calls``; a ``function_call_output`` is a tool message. Items chat has no
place for (``reasoning``, built-in tool calls, ...) ride, with ids, statuses and
annotations, in the private ``native`` field of the message they precede (the last
message for trailing ones), and come back in place; ``reasoning`` items come back even when
a compaction edited their message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compaction_worker.formats._common import (
    NATIVE,
    FormatError,
    Message,
    keep,
    restore,
    text_part,
    tool_call,
    validated,
)

FORMAT = "responses"

Item = dict[str, Any]

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _kind(item: Mapping[str, Any]) -> str:
    """The item's type; an easy input message (``role`` and ``content`` only) is a ``message``."""
    return str(item.get("type") or ("message" if "role" in item else ""))


def _part(part: Mapping[str, Any]) -> Message | None:
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return text_part(str(part.get("text", "")))
    if kind == "input_image" and part.get("image_url"):
        image: Message = {"url": part["image_url"]}
        if "detail" in part:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return None  # input_file, refusal, an image by file_id: kept in ``native``


def _content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    return [p for part in content if (p := _part(part)) is not None]


def _part_back(part: Mapping[str, Any], role: str) -> Item:
    kind = part.get("type")
    if kind == "text":
        return {
            "type": "output_text" if role == "assistant" else "input_text",
            "text": part.get("text") or "",
        }
    if kind == "image_url":
        image = part.get("image_url")
        image = image if isinstance(image, Mapping) else {"url": image}
        item = {"type": "input_image", "image_url": image.get("url")}
        return item | ({"detail": image["detail"]} if "detail" in image else {})
    return dict(part)


def _content_back(content: Any, role: str) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    return [_part_back(part, role) for part in content]


def _forward(group: Sequence[Mapping[str, Any]]) -> Message:
    """The chat message for one group of items (see :func:`_groups`)."""
    known = [item for item in group if _kind(item) in ("message", "function_call", "function_call_output")]
    first = known[0]
    if _kind(first) == "function_call_output":
        output = first.get("output")
        return {
            "role": "tool",
            "tool_call_id": str(first.get("call_id")),
            "content": output if isinstance(output, str) else _content(output),
        }
    message: Message = {"role": "assistant"}
    if _kind(first) == "message":
        role = _ROLES.get(str(first.get("role")))
        if role is None:
            raise FormatError(f"a message item with role {first.get('role')!r}")
        message = {"role": role, "content": _content(first.get("content"))}
    calls = [
        tool_call(str(item.get("call_id")), str(item.get("name")), str(item.get("arguments") or ""))
        for item in known
        if _kind(item) == "function_call"
    ]
    if calls:
        message["tool_calls"] = calls
    return message


def _back(message: Message) -> list[Item]:
    role = str(message["role"])
    if role == "tool":
        output = message.get("content")
        return [
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": output if isinstance(output, str) else _content_back(output, "user"),
            }
        ]
    items: list[Item] = []
    content = message.get("content")
    if content or not message.get("tool_calls"):
        items.append({"type": "message", "role": role, "content": _content_back(content, role)})
    items += [
        {
            "type": "function_call",
            "call_id": call.get("id"),
            "name": call["function"]["name"],
            "arguments": call["function"].get("arguments") or "",
        }
        for call in message.get("tool_calls") or []
    ]
    return items


def _groups(items: Sequence[Mapping[str, Any]]) -> list[list[Item]]:
    """Items cut into groups of one chat message each: unknown items join the next group."""
    groups: list[list[Item]] = []
    pending: list[Item] = []
    open_call_group = False  # whether a function_call may still join the last group
    for item in items:
        kind = _kind(item)
        if kind == "function_call" and open_call_group and not pending:
            groups[-1].append(dict(item))
        elif kind in ("message", "function_call", "function_call_output"):
            groups.append([*pending, dict(item)])
            pending = []
            open_call_group = kind == "function_call" or (
                kind == "message" and item.get("role") == "assistant"
            )
        else:
            pending.append(dict(item))
    if pending:
        if not groups:
            raise FormatError("no message, function_call or function_call_output item to carry the others")
        groups[-1] += pending
    return groups


def to_openai(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Stored messages for a list of Responses input or output items."""
    out = [keep(FORMAT, group, _forward(group), _back) for group in _groups(items)]
    return [validated(m, f"converted message {i}") for i, m in enumerate(out)]


def from_openai(messages: Iterable[Mapping[str, Any]]) -> list[Item]:
    """Stored messages as Responses input items."""
    items: list[Item] = []
    for message in messages:
        items += _restored(message)
    return items


def _restored(message: Mapping[str, Any]) -> list[Item]:
    """The items ``message`` came from; when a compaction edited it, its kept ``reasoning`` items
    still lead the items mapped from its new content (a call goes back with its reasoning)."""
    out: list[Item] = restore(FORMAT, message, _forward, _back)
    native = message.get(NATIVE)
    group = native.get("source") if isinstance(native, Mapping) and native.get("format") == FORMAT else None
    reasoning = [i for i in group if _kind(i) == "reasoning"] if isinstance(group, list) else []
    if reasoning and not any(_kind(i) == "reasoning" for i in out):
        out = [*reasoning, *out]
    return out
