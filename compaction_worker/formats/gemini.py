"""Gemini ``generateContent`` contents in and out of the stored form.

The system instruction travels apart from the contents. A model turn's ``function_call``
parts become its parallel ``tool_calls`` (Gemini has no call ids: a call without one is
``call_<k>``, its place among the turn's calls; ids made up here never go back out); a
user turn's ``function_response`` parts become one tool message each, paired by name and
order with the calls of the model turn before it, followed by a user message for its other
parts. Back, a run of tool messages and the user message after it regroup into one user
turn. Thoughts, ``thought_signature``, unknown parts and fields ride in the private
``native`` field (see :mod:`compaction_worker.formats._common`). Keys come in camelCase
(REST) or snake_case (the Python SDK), bytes as bytes or base64; they go out snake_case
and base64, as the REST API takes them.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from compaction_worker.formats._common import (
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

FORMAT = "gemini"

Content = dict[str, Any]
Part = dict[str, Any]
SystemInstruction = str | Mapping[str, Any]

_DATA = (
    "text",
    "inline_data",
    "file_data",
    "function_call",
    "function_response",
    "executable_code",
    "code_execution_result",
)
"""A part's data fields: one per part (Gemini's ``oneof``); the rest of a part is metadata."""

_OBJECTS = (*_DATA[1:], "video_metadata")
"""Part fields whose own keys are API names too (not ``args`` or ``response``: those are the caller's)."""


class GeminiContents(NamedTuple):
    """What ``generateContent`` takes apart: ``system_instruction`` and ``contents``."""

    system_instruction: Content | None
    contents: list[Content]


# --- input: camelCase or snake_case, checked ---------------------------------------------------


def _snake_keys(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", str(key)).lower()
        if name in out:
            raise FormatError(f"{where}: {name} given twice ({key!r} too)")
        out[name] = value
    return out


def _base64(value: Any) -> Any:
    """Bytes (the SDK's form) as base64 text (the REST API's); anything else as it is."""
    return base64.b64encode(value).decode("ascii") if isinstance(value, bytes | bytearray) else value


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _part_in(raw: Any, where: str) -> Part:
    """A part with snake_case keys, bytes as base64, checked."""
    if not isinstance(raw, Mapping):
        raise FormatError(f"{where}: a part is an object, not {type(raw).__name__}")
    part = _snake_keys(raw, where)
    for key in _OBJECTS:
        if key in part:
            if not isinstance(part[key], Mapping):
                raise FormatError(f"{where}: {key} is an object, not {type(part[key]).__name__}")
            part[key] = _snake_keys(part[key], f"{where} {key}")
    if "thought_signature" in part:
        part["thought_signature"] = _base64(part["thought_signature"])
    if "inline_data" in part and "data" in part["inline_data"]:
        part["inline_data"]["data"] = _base64(part["inline_data"]["data"])
    kinds = [key for key in _DATA if key in part]
    if len(kinds) > 1:
        raise FormatError(f"{where}: a part holds one of {', '.join(_DATA)}, not {' and '.join(kinds)}")
    problem = _problem(part)
    if problem:
        raise FormatError(f"{where}: {problem}")
    return part


def _problem(part: Part) -> str | None:
    """What is wrong with a known data field of ``part``, if anything."""
    blob, file = part.get("inline_data"), part.get("file_data")
    call, response = part.get("function_call"), part.get("function_response")
    if "text" in part and not isinstance(part["text"], str):
        return "text is a string"
    if blob is not None and not (
        isinstance(blob.get("mime_type"), str) and isinstance(blob.get("data"), str)
    ):
        return "inline_data needs mime_type and data (base64)"
    if file is not None and not isinstance(file.get("file_uri"), str):
        return "file_data needs file_uri"
    for kind, value, field in (("function_call", call, "args"), ("function_response", response, "response")):
        if value is None:
            continue
        if not (isinstance(value.get("name"), str) and value["name"]):
            return f"{kind} needs a name"
        if not isinstance(value.get(field, {}), Mapping) or not _is_json(value.get(field)):
            return f"{kind} {field} is a JSON object"
    return None


def _content_in(raw: Any, i: int) -> Content:
    """A content with its role (``user`` when absent) and checked snake_case parts."""
    where = f"content {i}"
    if not isinstance(raw, Mapping):
        raise FormatError(f"{where}: a Content is an object with role and parts, not {type(raw).__name__}")
    content = _snake_keys(raw, where)
    if extra := sorted(set(content) - {"role", "parts"}):
        raise FormatError(f"{where}: a Content has role and parts only, not {', '.join(extra)}")
    role = content.get("role") or "user"
    if role not in ("user", "model"):
        raise FormatError(f"{where}: the role is user or model, not {role!r}")
    return {"role": role, "parts": _parts_in(content.get("parts"), where)}


def _system_in(raw: SystemInstruction) -> Content:
    if isinstance(raw, str):
        return {"parts": [{"text": raw}]}
    if not isinstance(raw, Mapping):
        raise FormatError(f"system_instruction is a Content or a string, not {type(raw).__name__}")
    system = _snake_keys(raw, "system_instruction")
    return {**system, "parts": _parts_in(system.get("parts"), "system_instruction")}


def _parts_in(parts: Any, where: str) -> list[Part]:
    """The parts of ``where`` (a content or the system instruction), each checked."""
    if isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
        raise FormatError(f"{where}: parts is a list of parts")
    return [_part_in(p, f"{where} part {j}") for j, p in enumerate(parts)]


# --- parts -----------------------------------------------------------------------------------


def _part(part: Part) -> Message | None:
    """The chat content part for a text, inline_data or file_data part; None for any other."""
    if part.get("thought"):
        return None
    if "text" in part:
        return text_part(part["text"])
    if "inline_data" in part:
        blob = part["inline_data"]
        return {"type": "image_url", "image_url": {"url": data_url(blob["mime_type"], blob["data"])}}
    if "file_data" in part:
        file = part["file_data"]
        image = {"url": file["file_uri"]}
        if "mime_type" in file:  # LiteLLM reads a file's type from ``format``
            image["format"] = file["mime_type"]
        return {"type": "image_url", "image_url": image}
    return None


def _content(parts: Iterable[Part]) -> str | list[Message]:
    """Chat content for parts: one text as a string, else the list of chat parts ("" for none)."""
    chat = [p for part in parts if (p := _part(part)) is not None]
    if not chat:
        return ""
    if len(chat) == 1 and chat[0]["type"] == "text":
        return str(chat[0]["text"])
    return chat


def _part_back(chat: Mapping[str, Any]) -> Part:
    """The Gemini part for a chat content part (a part of another type passes as it is)."""
    kind = chat.get("type")
    if kind == "text":
        return {"text": chat.get("text") or ""}
    if kind == "image_url":
        image = chat.get("image_url")
        image = image if isinstance(image, Mapping) else {"url": image}
        url = str(image.get("url"))
        inline = split_data_url(url)
        if inline:
            return {"inline_data": {"mime_type": inline[0], "data": inline[1]}}
        file = {"mime_type": image["format"]} if image.get("format") else {}
        return {"file_data": {**file, "file_uri": url}}
    return dict(chat)


def _parts_back(content: Any) -> list[Part]:
    if content is None or isinstance(content, str):
        return [{"text": content}] if content else []
    return [_part_back(part) for part in content]


# --- units: system instruction, model turn, function response, user turn ---------------------


def _system(system: Content) -> Message:
    return {"role": "system", "content": _content(system["parts"])}


def _system_back(message: Message) -> Content:
    return {"parts": _parts_back(message.get("content"))}


def _assistant(content: Content) -> Message:
    calls = [p["function_call"] for p in content["parts"] if "function_call" in p]
    tool_calls = [
        tool_call(
            str(call.get("id") or f"call_{k}"),
            call["name"],
            json.dumps(call.get("args", {}), ensure_ascii=False),
        )
        for k, call in enumerate(calls)
    ]
    return assistant_message(_content(content["parts"]), tool_calls)


def _assistant_back(message: Message) -> Content:
    calls = [
        {
            "function_call": {
                "name": call["function"]["name"],
                "args": call_arguments(call["function"].get("arguments")),
            }
        }
        for call in message.get("tool_calls") or []
    ]
    return {"role": "model", "parts": [*_parts_back(message.get("content")), *calls]}


def _tool(part: Part, call_id: str) -> Message:
    response = part["function_response"].get("response", {})
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(response, ensure_ascii=False)}


def _tool_back(message: Message, name: str | None, where: str) -> Part:
    if name is None:
        raise FormatError(
            f"{where}: a tool result for {message.get('tool_call_id')!r}, which no call before it has"
        )
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(str(p.get("text", "")) for p in content or [])
    try:
        response = json.loads(text)
    except ValueError:
        response = None
    return {
        "function_response": {
            "name": name,
            "response": response if isinstance(response, dict) else {"output": text},
        }
    }


def _is_response(part: Mapping[str, Any]) -> bool:
    return "function_response" in part


def _user(content: Content) -> Message:
    """The user message for a user turn's parts other than its function responses."""
    return {"role": "user", "content": _content(p for p in content["parts"] if not _is_response(p))}


def _user_back(message: Message) -> Content:
    return {"role": "user", "parts": _parts_back(message.get("content"))}


def _call_id(response: Mapping[str, Any], n: int, calls: list[tuple[str, str]] | None, where: str) -> str:
    """The id of the call a function response answers (and that call taken from ``calls``).

    Its own id if it has one; else the first call of its name in the model turn before it
    still unanswered; with no model turn before it (a turn converted alone), ``call_<n>``
    for the n-th response of the turn, the id its call got if the responses are in order.
    """
    name = response["name"]
    if "id" in response or calls is None:
        call_id = str(response.get("id") or f"call_{n}")
        if calls is not None and (name, call_id) in calls:
            calls.remove((name, call_id))
        return call_id
    for call in calls:
        if call[0] == name:
            calls.remove(call)
            return call[1]
    raise FormatError(
        f"{where}: a function_response for {name!r}, which the model turn before it does not call"
    )


def _user_turn(content: Content, calls: list[tuple[str, str]] | None, i: int) -> list[Message]:
    """A tool message per function response, in order, then a user message for the other parts."""
    parts = content["parts"]
    responses = [j for j, part in enumerate(parts) if _is_response(part)]
    out: list[Message] = []
    for n, j in enumerate(responses):
        response = parts[j]["function_response"]
        call_id = _call_id(response, n, calls, f"content {i} part {j}")
        back = partial(_tool_back, name=response["name"], where=f"content {i} part {j}")
        out.append(keep(FORMAT, parts[j], _tool(parts[j], call_id), back))
    rest = [part for part in parts if not _is_response(part)]
    if rest or not responses:
        # a part before a response: keep the whole turn, so that its order comes back
        interleaved = any(not _is_response(part) for part in parts[: responses[-1]]) if responses else False
        unit = content if interleaved else {**content, "parts": rest}
        out.append(keep(FORMAT, unit, _user(unit), _user_back))
    return out


# --- whole conversations ---------------------------------------------------------------------


def _unpacked(contents: Any, system_instruction: Any) -> tuple[Any, Any]:
    """The contents and system instruction of a request body (its other fields are no history)."""
    if not isinstance(contents, Mapping):
        return contents, system_instruction
    body = _snake_keys(contents, "the request")
    if body.get("system_instruction") is not None and system_instruction is not None:
        raise FormatError("a system instruction both in the request and given apart")
    return body.get("contents"), body.get("system_instruction") or system_instruction


def to_openai(
    contents: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    system_instruction: SystemInstruction | None = None,
) -> list[Message]:
    """Stored messages for Gemini contents (or a whole request body), the system instruction first."""
    items, system_instruction = _unpacked(contents, system_instruction)
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise FormatError(f"contents is a list of Content objects, not {type(items).__name__}")
    out: list[Message] = []
    if system_instruction:
        system = _system_in(system_instruction)
        out.append(keep(FORMAT, system, _system(system), _system_back))
    calls: list[tuple[str, str]] | None = None  # (name, id) of the last model turn's unanswered calls
    for i, raw in enumerate(items):
        content = _content_in(raw, i)
        if content["role"] == "model":
            message = _assistant(content)
            out.append(keep(FORMAT, content, message, _assistant_back))
            calls = [(c["function"]["name"], c["id"]) for c in message.get("tool_calls", [])]
        else:
            out += _user_turn(content, calls, i)
    return [validated(m, f"converted message {i}") for i, m in enumerate(out)]


def from_openai(messages: Iterable[Mapping[str, Any]]) -> GeminiContents:
    """Stored messages as Gemini's ``system_instruction`` and ``contents`` (system messages hoisted)."""
    systems: list[Content] = []
    contents: list[Content] = []
    group: Content | None = None  # the user turn function responses are gathering in
    names: dict[str, str] = {}  # call id -> function name, of the last assistant message
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "system":
            systems.append(restore(FORMAT, message, _system, _system_back))
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            back = partial(_tool_back, name=names.get(call_id), where=f"message {i}")
            part = restore(FORMAT, message, partial(_tool, call_id=call_id), back)
            if group is None:
                group = {"role": "user", "parts": []}
                contents.append(group)
            group["parts"].append(part)
        elif role == "user":
            user = restore(FORMAT, message, _user, _user_back)
            answers = [part for part in user["parts"] if _is_response(part)]
            others = [part for part in user["parts"] if not _is_response(part)]
            if group is None and contents and contents[-1].get("role") == "user":
                # After another user message (the task before the summary turn): one user turn,
                # as LiteLLM sends Gemini (roles alternate).
                contents[-1]["parts"] = [*contents[-1]["parts"], *others]
            elif group is None:
                contents.append({**user, "parts": others})
            elif answers and answers == group["parts"]:  # a whole turn, its results unchanged
                group["parts"] = user["parts"]
            else:
                group["parts"] += others
            group = None
        else:
            model = restore(FORMAT, message, _assistant, _assistant_back)
            names = {str(c.get("id")): c["function"]["name"] for c in message.get("tool_calls") or []}
            contents.append(model)
            group = None
    return GeminiContents(_joined(systems), contents)


def _joined(systems: list[Content]) -> Content | None:
    """One system instruction: the only one as it is, several as their parts in order."""
    if len(systems) <= 1:
        return systems[0] if systems else None
    return {"parts": [part for system in systems for part in system["parts"]]}
