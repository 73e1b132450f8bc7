"""Recorded conversations from JSONL files: OpenAI chat, or the formats/ adapters' shapes.

A file holds either one message per line (the whole file is one conversation) or one
conversation per line (``{"messages": [...], "model": ...}``, or ``{"input": [...]}`` for
Responses items). A bad line becomes a :class:`LineError` naming its file and line; the
other lines are still read.

A file that is one JSON document (not one per line) is an agent's published trajectory:
SWE-agent's ``{"history": [...]}``, mini-swe-agent's ``{"messages": [...],
"trajectory_format": ...}`` or a bare list of messages (:func:`agent_message` says what is
kept of each message).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from compaction_worker.contracts.events import ChatMessage
from compaction_worker.errors import CompactionWorkerError
from compaction_worker.formats import anthropic, gemini, langchain, responses, tool_call

try:
    from langchain_core.messages import messages_from_dict as _messages_from_dict
except ImportError:  # optional, as for the LangChain adapter: only LangChain input needs it
    _messages_from_dict = None  # type: ignore[assignment]  # absent without langchain-core

Format = Literal["auto", "openai", "responses", "anthropic", "gemini", "langchain"]

_RESPONSES_KINDS = frozenset({"message", "function_call", "function_call_output", "reasoning"})
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
_LANGCHAIN_TYPES = frozenset({"human", "ai", "system", "tool", "function", "chat"})
_CONVERSATION_KEYS = ("messages", "input", "contents")
_MESSAGE_KEYS = frozenset({"role", "type", "parts"})
"""A message has one: chat, Anthropic and Gemini ones a role (Gemini's may have parts only),
Responses items and LangChain's dicts a type."""
AGENT_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
"""The chat message fields an agent trajectory's messages keep (the rest is the agent's own record)."""


class ReplayInputError(CompactionWorkerError, ValueError):
    """A recorded conversation that cannot be replayed."""


@dataclass(frozen=True, slots=True)
class LineError:
    """A line (0: the whole file) that could not be read, and why."""

    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}" if self.line else f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Conversation:
    """One recorded conversation in the stored form (OpenAI chat messages, as the worker stores them)."""

    name: str
    messages: tuple[dict[str, Any], ...]
    model: str | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    context_window: int | None = None
    source: str = ""


@dataclass(slots=True)
class ReadResult:
    """The conversations found, the lines that were skipped, and the files that hold no conversation."""

    conversations: list[Conversation] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    """Lines (or whole conversations) of recognised files that could not be read."""
    unrecognised: list[Path] = field(default_factory=list)
    """Files in none of the layouts read here (a README, a LICENSE, an image): not errors, not read."""


def read_paths(paths: Iterable[Path], fmt: Format = "auto") -> ReadResult:
    """Every conversation in the files (a directory: every file under it, subfolders too, by path)."""
    result = ReadResult()
    for path in paths:
        for file in files_under(path):
            found = read_file(file, fmt)
            result.conversations += found.conversations
            result.errors += found.errors
            result.unrecognised += found.unrecognised
    return result


def files_under(path: Path) -> list[Path]:
    """``path`` itself, or for a directory every file under it by path, hidden ones left out (editor
    backups, ``.DS_Store``, a ``.git`` folder: no recordings)."""
    if not path.is_dir():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def read_file(path: Path, fmt: Format = "auto") -> ReadResult:
    """The conversations in one JSONL file (see the module's docstring for the two layouts); a file
    in neither comes back as unrecognised."""
    result = ReadResult()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file
        result.unrecognised.append(path)
        return result
    except OSError as e:
        result.errors.append(LineError(path, 0, f"cannot read: {e.strerror or e}"))
        return result
    lines = text.splitlines()
    if len(lines) > 1 and (trajectory := _agent_trajectory(text)) is not None:
        # An agent trajectory's messages: the file's one conversation.
        try:
            result.conversations.append(_conversation({"messages": trajectory}, "openai", _stem(path), path))
        except (ReplayInputError, ValueError) as e:
            result.errors.append(LineError(path, 0, _reason(e)))
        return result
    if not _recognised(lines):
        result.unrecognised.append(path)
        return result
    records = _json_lines(lines, path, result.errors)
    if _is_conversation(records[0][1]):
        for number, data in records:
            try:
                if not _is_conversation(data):
                    raise ReplayInputError("a message line in a file of conversation lines")
                result.conversations.append(_conversation(data, fmt, f"{path.stem}:{number}", path))
            except (ReplayInputError, ValueError) as e:
                result.errors.append(LineError(path, number, _reason(e)))
        return result
    messages = _message_lines(records, fmt, path, result.errors)
    if messages:
        result.conversations.append(Conversation(path.stem, tuple(messages), source=str(path)))
    return result


def _json_lines(
    lines: Sequence[str], path: Path, errors: list[LineError]
) -> list[tuple[int, dict[str, Any]]]:
    """The file's JSON objects by line number; every other non-blank line is an error."""
    records: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as e:
            errors.append(LineError(path, number, f"not JSON: {e}"))
            continue
        if not isinstance(data, dict):
            errors.append(LineError(path, number, f"not a JSON object but {type(data).__name__}"))
            continue
        records.append((number, data))
    return records


def _recognised(lines: Sequence[str]) -> bool:
    """Whether the first line that is not blank is a conversation or a message as JSON: JSON lines
    this module reads. A bad line after it is that line's error; a first one is no such file."""
    first = next((line for line in lines if line.strip()), None)
    try:
        data = json.loads(first) if first is not None else None
    except ValueError:
        return False
    return isinstance(data, dict) and (_is_conversation(data) or not _MESSAGE_KEYS.isdisjoint(data))


def _stem(path: Path) -> str:
    """A trajectory's name: its file name without ``.json`` and ``.traj``."""
    return path.name.removesuffix(".json").removesuffix(".traj").removesuffix(".jsonl")


def _agent_trajectory(text: str) -> list[dict[str, Any]] | None:
    """The messages of a file that is one JSON document in an agent's layout, else None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None  # JSON lines, or not JSON: read line by line
    if isinstance(data, dict) and isinstance(data.get("history"), list):
        raw = data["history"]  # SWE-agent
    elif isinstance(data, dict) and "trajectory_format" in data and isinstance(data.get("messages"), list):
        raw = data["messages"]  # mini-swe-agent
    elif isinstance(data, list) and data and all(isinstance(m, dict) and "role" in m for m in data):
        raw = data
    else:
        return None
    return [agent_message(m) for m in raw if isinstance(m, dict) and m.get("role") != "exit"]


def agent_message(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's recorded message as a chat message: only :data:`AGENT_MESSAGE_FIELDS` (SWE-agent's
    ``thought`` and ``action``, mini-swe-agent's ``extra`` go), SWE-agent's ``tool_call_ids``
    as the ``tool_call_id`` it holds, tool calls in OpenAI's shape; the content untouched."""
    message = {k: raw[k] for k in AGENT_MESSAGE_FIELDS if raw.get(k) is not None}
    ids = raw.get("tool_call_ids")
    if isinstance(ids, list) and len(ids) == 1 and "tool_call_id" not in message:
        message["tool_call_id"] = ids[0]
    if isinstance(message.get("tool_calls"), list):
        message["tool_calls"] = [
            tool_call(call.get("id"), (f := call.get("function") or {}).get("name"), f.get("arguments"))
            for call in message["tool_calls"]
            if isinstance(call, dict)
        ]
    return message


def _reason(error: Exception) -> str:
    """An error's first line: a report names each bad line on one line."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _is_conversation(data: Mapping[str, Any]) -> bool:
    return any(isinstance(data.get(key), list) for key in _CONVERSATION_KEYS)


def _conversation(data: Mapping[str, Any], fmt: Format, default_name: str, path: Path) -> Conversation:
    """One conversation line: ``messages`` (chat, Anthropic or LangChain), ``input`` (Responses) or ``contents`` (Gemini)."""
    name = data.get("conversation_id") or data.get("id") or default_name
    key = next(k for k in _CONVERSATION_KEYS if isinstance(data.get(k), list))
    items: list[Any] = data[key]
    if not all(isinstance(i, dict) for i in items):
        raise ReplayInputError("every message must be a JSON object")
    system = (
        data.get("system")
        or data.get("instructions")
        or data.get("system_instruction")
        or data.get("systemInstruction")
    )
    if fmt == "auto":
        by_key: dict[str, Format] = {"input": "responses", "contents": "gemini"}
        fmt = by_key.get(key) or _detect(items)
        if fmt == "openai" and "system" in data:
            fmt = "anthropic"
    messages = _convert(items, fmt, system)
    tools = data.get("tools")
    window = data.get("context_window")
    model = data.get("model")
    return Conversation(
        name=str(name),
        messages=tuple(messages),
        model=model if isinstance(model, str) else None,
        tools=tuple(tools) if isinstance(tools, list) and tools else None,
        context_window=window if isinstance(window, int) and window > 0 else None,
        source=str(path),
    )


def _message_lines(
    records: Sequence[tuple[int, dict[str, Any]]], fmt: Format, path: Path, errors: list[LineError]
) -> list[dict[str, Any]]:
    """A file of one message (or item) per line; each line converted alone except Responses items."""
    if fmt == "auto":
        fmt = _detect([data for _, data in records])
    if fmt == "responses":
        # A function_call item joins the assistant message before it: convert them together.
        try:
            return _convert([data for _, data in records], fmt, None)
        except ValueError as e:
            errors.append(LineError(path, 0, _reason(e)))
            return []
    messages: list[dict[str, Any]] = []
    for number, data in records:
        try:
            messages += _convert([data], fmt, None)
        except ValueError as e:
            errors.append(LineError(path, number, _reason(e)))
    return messages


def _detect(items: Sequence[Mapping[str, Any]]) -> Format:
    """The format the items are in, from their shape."""
    if any(isinstance(i.get("data"), dict) and i.get("type") in _LANGCHAIN_TYPES for i in items):
        return "langchain"
    if any(i.get("type") in _RESPONSES_KINDS for i in items):
        return "responses"
    if any(isinstance(i.get("parts"), list) and "content" not in i for i in items):
        return "gemini"
    for item in items:
        content = item.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS for b in content
        ):
            return "anthropic"
    return "openai"


def _convert(items: Sequence[Mapping[str, Any]], fmt: Format, system: Any) -> list[dict[str, Any]]:
    """Stored messages, as the worker stores a turn's messages (its contract's plain form)."""
    try:
        converted = _adapted(items, fmt, system)
    except (TypeError, KeyError, AttributeError) as e:  # a shape the adapter did not expect at all
        raise ReplayInputError(f"not {fmt} messages: {type(e).__name__}: {e}") from e
    stored = []
    for i, message in enumerate(converted):
        try:
            stored.append(ChatMessage.model_validate(message).to_dict())
        except ValidationError as e:
            where = f"message {i}: " if len(converted) > 1 else ""
            raise ReplayInputError(f"{where}not a valid chat message: {e.errors()[0]['msg']}") from e
    return stored


def _adapted(items: Sequence[Mapping[str, Any]], fmt: Format, system: Any) -> list[dict[str, Any]]:
    """The items in chat form, through the format's adapter (chat itself: copied as they are)."""
    if fmt == "responses":
        converted = responses.to_openai(items)
        if isinstance(system, str) and system:
            converted.insert(0, {"role": "system", "content": system})
    elif fmt == "anthropic":
        converted = anthropic.to_openai(items, system or None)
    elif fmt == "gemini":
        converted = gemini.to_openai(items, system or None)
    elif fmt == "langchain":
        converted = langchain.to_openai(_langchain_messages(items))
    else:  # the stored form itself: checked by the caller, as the worker checks a turn's messages
        converted = [dict(m) for m in items]
        if isinstance(system, str) and system:
            converted.insert(0, {"role": "system", "content": system})
    return converted


def _langchain_messages(items: Sequence[Mapping[str, Any]]) -> list[Any]:
    """LangChain messages from their dict form (``message_to_dict``'s ``{"type", "data"}``)."""
    if _messages_from_dict is None:
        raise ReplayInputError("LangChain messages need langchain-core: pip install langchain-core")
    try:
        return list(_messages_from_dict([dict(i) for i in items]))
    except (KeyError, TypeError, ValueError) as e:
        raise ReplayInputError(f"not a LangChain message: {e}") from e
