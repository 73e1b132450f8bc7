"""LangChain ``BaseMessage`` lists in and out of the stored form (needs ``langchain-core``).

``SystemMessage``, ``HumanMessage``, ``AIMessage`` (its ``tool_calls`` become chat tool
calls) and ``ToolMessage`` map to the four chat roles. Ids, metadata, ``additional_kwargs``,
a tool message's status and artifact, and content blocks chat has no place for ride in the
private ``native`` field (as ``message_to_dict`` gives them) and come back unchanged.
langchain-core is optional: this module imports without it and says so when used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compaction_worker.formats._common import (
    FormatError,
    Message,
    assistant_message,
    call_arguments,
    data_url,
    keep,
    restore,
    text_part,
    tool_call,
    validated,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

try:
    from langchain_core import messages as _lc
except ImportError as e:  # an optional dependency: only the functions below need it
    _MISSING: ImportError | None = e
else:
    _MISSING = None

FORMAT = "langchain"


def _require() -> None:
    if _MISSING is not None:
        raise FormatError("LangChain messages need langchain-core: pip install langchain-core") from _MISSING


def _part(block: Any) -> Message | None:
    """The chat part for a LangChain content block (OpenAI-style or standard), or None."""
    if isinstance(block, str):
        return text_part(block)
    kind = block.get("type")
    if kind == "text":
        return text_part(str(block.get("text", "")))
    if kind == "image_url":
        image = block["image_url"]
        return {
            "type": "image_url",
            "image_url": dict(image) if isinstance(image, Mapping) else {"url": image},
        }
    if kind == "image" and (block.get("url") or block.get("base64")):
        url = block.get("url") or data_url(str(block.get("mime_type")), str(block["base64"]))
        return {"type": "image_url", "image_url": {"url": url}}
    return None


def _content(content: str | list[Any]) -> str | list[Message]:
    return (
        content if isinstance(content, str) else [p for block in content if (p := _part(block)) is not None]
    )


def _forward(message: BaseMessage) -> Message:
    content = _content(message.content)
    if isinstance(message, _lc.SystemMessage):
        return {"role": "system", "content": content}
    if isinstance(message, _lc.HumanMessage):
        return {"role": "user", "content": content}
    if isinstance(message, _lc.ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": content}
    if isinstance(message, _lc.AIMessage):
        calls = [
            tool_call(call["id"], call["name"], json.dumps(call["args"], ensure_ascii=False))
            for call in message.tool_calls
        ]
        return assistant_message(content, calls)
    raise FormatError(f"a {type(message).__name__}: only System, Human, AI and Tool messages map to chat")


def _back(message: Message) -> BaseMessage:
    raw = message.get("content")
    content: str | list[Any] = raw if isinstance(raw, str) else [dict(p) for p in raw or []]
    role = message["role"]
    if role == "system":
        return _lc.SystemMessage(content=content)
    if role == "user":
        return _lc.HumanMessage(content=content)
    if role == "tool":
        return _lc.ToolMessage(content=content, tool_call_id=str(message["tool_call_id"]))
    calls = [
        _lc.ToolCall(
            name=c["function"]["name"], args=call_arguments(c["function"].get("arguments")), id=c.get("id")
        )
        for c in message.get("tool_calls") or []
    ]
    return _lc.AIMessage(content=content, tool_calls=calls)


def _as_dict(message: BaseMessage) -> dict[str, Any]:
    return _lc.message_to_dict(message)


def _from_dict(data: Mapping[str, Any]) -> BaseMessage:
    return _lc.messages_from_dict([dict(data)])[0]


def to_openai(messages: Sequence[BaseMessage]) -> list[Message]:
    """Stored messages for a list of LangChain messages."""
    _require()
    out = [keep(FORMAT, _as_dict(m), _forward(m), lambda plain: _as_dict(_back(plain))) for m in messages]
    return [validated(m, f"converted message {i}") for i, m in enumerate(out)]


def from_openai(messages: Iterable[Mapping[str, Any]]) -> list[BaseMessage]:
    """Stored messages as LangChain messages."""
    _require()
    return [
        _from_dict(restore(FORMAT, m, lambda data: _forward(_from_dict(data)), lambda p: _as_dict(_back(p))))
        for m in messages
    ]
