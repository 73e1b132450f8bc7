"""Anthropic Messages in and out of the stored form.

The system prompt travels apart from the messages. An assistant message's ``tool_use``
blocks become its parallel ``tool_calls``; a user message's ``tool_result`` blocks become
one tool message each, in order, followed by a user message for its other blocks (chat
wants the results right after the calls). Back, a run of tool messages and the user
message after it regroup into one user message. ``thinking``, unknown blocks and extra
fields ride in the private ``native`` field (see :mod:`compaction_worker.formats._common`);
thinking blocks come back even when a compaction edited their message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from compaction_worker.formats._common import (
    NATIVE,
    FormatError,
    Message,
    assistant_message,
    call_arguments,
    data_url,
    keep,
    restore,
    split_data_url,
    text_part,
    tool_call,
    validated,
)

FORMAT = "anthropic"

System = str | list[dict[str, Any]]


class AnthropicMessages(NamedTuple):
    """What the Messages API takes apart: ``system=`` and ``messages=``."""

    system: System | None
    messages: list[dict[str, Any]]


# --- blocks and parts -------------------------------------------------------------------


def _part(block: Mapping[str, Any]) -> Message | None:
    """The chat content part for a text or image block; None for any other block."""
    kind = block.get("type")
    if kind == "text":
        part = text_part(str(block.get("text", "")))
    elif kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64":
            url = data_url(str(source.get("media_type")), str(source.get("data")))
        elif source.get("type") == "url":
            url = str(source.get("url"))
        else:
            return None
        part = {"type": "image_url", "image_url": {"url": url}}
    else:
        return None
    if "cache_control" in block:  # LiteLLM reads it from chat parts too
        part["cache_control"] = block["cache_control"]
    return part


def _parts(blocks: Iterable[Mapping[str, Any]]) -> list[Message]:
    return [part for block in blocks if (part := _part(block)) is not None]


def _block(part: Mapping[str, Any]) -> dict[str, Any]:
    """The Anthropic block for a chat content part (a part of another type passes as it is)."""
    kind = part.get("type")
    if kind == "text":
        block: dict[str, Any] = {"type": "text", "text": part.get("text") or ""}
    elif kind == "image_url":
        image = part.get("image_url")
        url = str(image.get("url") if isinstance(image, Mapping) else image)
        inline = split_data_url(url)
        source = (
            {"type": "base64", "media_type": inline[0], "data": inline[1]}
            if inline
            else {"type": "url", "url": url}
        )
        block = {"type": "image", "source": source}
    else:
        return dict(part)
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _content_back(content: Any) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    return _blocks(content)


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Chat content as a list of blocks (a string becomes one text block, unless empty)."""
    if content is None or isinstance(content, str):
        return [text_part(content)] if content else []
    return [_block(part) for part in content]


# --- units: system, assistant message, tool result, user message --------------------------


def _system(system: System) -> Message:
    return {"role": "system", "content": system if isinstance(system, str) else _parts(system)}


def _system_back(message: Message) -> System:
    return _content_back(message.get("content"))


def _assistant(message: Mapping[str, Any]) -> Message:
    content = message.get("content")
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    blocks = list(content or [])
    calls = [
        tool_call(str(b.get("id")), str(b.get("name")), json.dumps(b.get("input", {})))
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    return assistant_message(_parts(blocks), calls)


def _assistant_back(message: Message) -> dict[str, Any]:
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": _content_back(content)}
    uses = [
        {
            "type": "tool_use",
            "id": call.get("id"),
            "name": call["function"]["name"],
            "input": call_arguments(call["function"].get("arguments")),
        }
        for call in calls
    ]
    return {"role": "assistant", "content": [*_blocks(content), *uses]}


def _tool(block: Mapping[str, Any]) -> Message:
    content = block.get("content", "")
    return {
        "role": "tool",
        "tool_call_id": str(block.get("tool_use_id")),
        "content": content if isinstance(content, str) else _parts(content),
    }


def _tool_back(message: Message) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": message.get("tool_call_id"),
        "content": _content_back(message.get("content")),
    }


def _user(message: Mapping[str, Any]) -> Message:
    content = message.get("content")
    return {"role": "user", "content": content if isinstance(content, str) else _parts(content or [])}


def _user_back(message: Message) -> dict[str, Any]:
    return {"role": "user", "content": _content_back(message.get("content"))}


# --- whole conversations --------------------------------------------------------------------


def to_openai(messages: Sequence[Mapping[str, Any]], system: System | None = None) -> list[Message]:
    """Stored messages for an Anthropic conversation (``system`` first, when given)."""
    out = [keep(FORMAT, system, _system(system), _system_back)] if system else []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role == "assistant":
            out.append(keep(FORMAT, dict(message), _assistant(message), _assistant_back))
        elif role == "user" and isinstance(content, list):
            results = [b for b in content if b.get("type") == "tool_result"]
            out += [keep(FORMAT, dict(b), _tool(b), _tool_back) for b in results]
            rest = {**message, "content": [b for b in content if b.get("type") != "tool_result"]}
            if rest["content"] or not results:
                out.append(keep(FORMAT, rest, _user(rest), _user_back))
        elif role == "user":
            out.append(keep(FORMAT, dict(message), _user(message), _user_back))
        else:
            raise FormatError(f"message {i}: Anthropic messages are user or assistant, not {role!r}")
    return [validated(m, f"converted message {i}") for i, m in enumerate(out)]


def from_openai(messages: Iterable[Mapping[str, Any]]) -> AnthropicMessages:
    """Stored messages as Anthropic's ``system`` and ``messages`` (system messages hoisted)."""
    systems: list[System] = []
    out: list[dict[str, Any]] = []
    group: dict[str, Any] | None = None  # the user message tool results are gathering in
    for message in messages:
        role = message.get("role")
        if role == "system":
            systems.append(restore(FORMAT, message, _system, _system_back))
        elif role == "tool":
            block = restore(FORMAT, message, _tool, _tool_back)
            if group is None:
                group = {"role": "user", "content": []}
                out.append(group)
            group["content"].append(block)
        elif role == "user":
            user = restore(FORMAT, message, _user, _user_back)
            # After tool results, or after another user message (the task before the summary
            # turn): one user turn, as the API would combine them; roles keep alternating.
            previous = (
                group if group is not None else out[-1] if out and out[-1].get("role") == "user" else None
            )
            if previous is not None:
                previous["content"] = [*_listed(previous), *_blocks(user.pop("content"))]
                previous.update(user)
            else:
                out.append(user)
            group = None
        else:
            out.append(_assistant_restored(message))
            group = None
    return AnthropicMessages(_joined(systems), out)


_THINKING = ("thinking", "redacted_thinking")
"""Thinking blocks: an edited assistant message keeps them, and no ``cache_control`` goes on one
(the Messages API refuses it)."""


def _assistant_restored(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message ``message`` came from; when a compaction edited its text, the
    kept message's thinking blocks still lead it, unchanged.

    Their signatures cover the thinking alone, and the API rejects a tool loop whose last
    assistant message lost them (extended thinking with tool use).
    """
    out = restore(FORMAT, message, _assistant, _assistant_back)
    native = message.get(NATIVE)
    source = native.get("source") if isinstance(native, Mapping) and native.get("format") == FORMAT else None
    content = source.get("content") if isinstance(source, Mapping) else None
    thinking = [b for b in content if b.get("type") in _THINKING] if isinstance(content, list) else []
    if thinking and not any(isinstance(b, Mapping) and b.get("type") in _THINKING for b in _listed(out)):
        out["content"] = [*thinking, *_listed(out)]
    return out


def _listed(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return [text_part(content)] if isinstance(content, str) and content else list(content or [])


def _joined(systems: list[System]) -> System | None:
    """One system prompt: the only one as it is, several as one list of text blocks."""
    if len(systems) <= 1:
        return systems[0] if systems else None
    blocks: list[dict[str, Any]] = []
    for system in systems:
        blocks += [{"type": "text", "text": system}] if isinstance(system, str) else system
    return blocks


# --- prompt-cache breakpoints -------------------------------------------------------------

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
"""The ``cache_control`` of a breakpoint (Anthropic's default five-minute cache)."""


def with_cache_breakpoints(
    rendered: AnthropicMessages, stable: int | None, chunks: Sequence[str] = ()
) -> AnthropicMessages:
    """``rendered`` with prompt-cache breakpoints at its stable boundaries (three of the four the
    API allows): the end of the system prompt, the end of the summary chunks in message
    ``stable`` (the summary turn), and the end of the last message (the next call reads
    everything before its own new messages from the cache).

    ``chunks`` are the summary chunks' texts as the summary turn holds them, in order: the turn
    is sent as one text block per chunk, then one for the rest (the standing state, the restored
    working state), with the breakpoint on the last chunk's. A compaction that adds a chunk
    leaves the earlier blocks as they were, and the cache serves them (it looks back from a
    breakpoint for the longest prefix it holds); the rest changes at every compaction.
    """
    system = rendered.system
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
    elif isinstance(system, list) and system:
        system = [*system[:-1], {**system[-1], "cache_control": EPHEMERAL}]
    messages = list(rendered.messages)
    last = len(messages) - 1
    if stable is not None and 0 <= stable <= last:
        messages[stable] = _chunked(messages[stable], chunks) if chunks else _marked(messages[stable])
    if last >= 0 and last != stable:
        messages[last] = _marked(messages[last])
    return AnthropicMessages(system, messages)


def _chunked(message: Mapping[str, Any], chunks: Sequence[str]) -> dict[str, Any]:
    """The summary turn as one text block per chunk, then the rest, the breakpoint on the last
    chunk's (the blocks before the summary's, the task's, stay as they are); marked whole
    (:func:`_marked`) when no text of it starts with the chunks."""
    joined = "\n\n".join(chunks)
    listed = _listed(message)
    at = next(
        (
            i
            for i, b in enumerate(listed)
            if b.get("type") == "text" and str(b.get("text")).startswith(joined)
        ),
        None,
    )
    if at is None:
        return _marked(message)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in chunks]
    blocks[-1]["cache_control"] = EPHEMERAL
    rest = str(listed[at]["text"])[len(joined) :].removeprefix("\n\n")
    if rest:
        blocks.append({"type": "text", "text": rest})
    return {**message, "content": [*listed[:at], *blocks, *listed[at + 1 :]]}


def _marked(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` with a breakpoint on its last block that takes one (text becomes a text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content, "cache_control": EPHEMERAL}]}
    if not isinstance(content, list):
        return dict(message)
    blocks = list(content)
    for i in range(len(blocks) - 1, -1, -1):
        if isinstance(blocks[i], dict) and blocks[i].get("type") not in _THINKING:
            blocks[i] = {**blocks[i], "cache_control": EPHEMERAL}
            break
    return {**message, "content": blocks}
