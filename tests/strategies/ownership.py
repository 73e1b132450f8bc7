"""docs/design.md, invariant 8, as a check: every tool result stays under its own call, with what is its own."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compaction_worker.contracts.history import Entry
from compaction_worker.contracts.toolpairs import ToolCall, pair_results

from .conversations import Conversation

PRUNED = "[Old tool result cleared: {tool},"
FILE_POINTER = re.compile(r"\[File (?P<path>.+) - refer to the latest read below\]")
IDENTICAL = "[Identical to a later {tool} output below]"


def ownership_problems(conversation: Conversation, entries: Sequence[Entry]) -> list[str]:
    """Ways a compacted history puts a tool result, or what stands for it, under a call not its own.

    docs/design.md, invariant 8: every tool result of ``entries`` answers, by position, the very call it
    answered in the conversation (or a synthetic call, when its own is gone), and holds
    its own original content or a placeholder about its own call: a prune placeholder
    naming its own tool, a pointer to the file its own call read with a later read of
    that file by the same tool in the conversation, an "identical to a later output" of its
    own tool with a later identical output, or a head and tail of its own original.
    """
    before = conversation.entries
    own: dict[int, tuple[int, ToolCall]] = {
        before[i].n: (before[call.owner].n, call)
        for i, call in pair_results([e.message for e in before]).items()
    }
    # What each result of the conversation was: its tool, the file it read, its content.
    facts: list[tuple[int, str, str | None, str]] = []
    for e in before:
        if e.role == "tool" and e.n in own:
            mine = own[e.n][1]
            facts.append((e.n, _tool(e.message, mine), _path(mine), _key(e.message.get("content"))))
    kept = {e.n for e in entries}
    held = {e.n: e.message for e in before}
    contents = {n: k for n, _, _, k in facts}
    problems: list[str] = []
    paired = pair_results([e.message for e in entries])
    for j, entry in enumerate(entries):
        if entry.role != "tool" or entry.n == 0:
            continue
        call = paired.get(j)
        expected = own.get(entry.n)
        if call is None:
            problems.append(f"result {entry.n} follows no call of its id")
            continue
        owner = entries[call.owner].n
        if owner == 0:
            if expected is not None and expected[0] in kept:
                problems.append(f"result {entry.n} moved behind a synthetic call; its own is kept")
        elif expected is None or (owner, call.slot) != (expected[0], expected[1].slot):
            problems.append(f"result {entry.n} answers call {call.slot} of {owner}, not its own {expected}")
        # What the conversation already held was checked when it was made (a rolling
        # compaction's input carries the placeholders of the one before).
        if expected is not None and entry.message != held.get(entry.n):
            original = conversation.transcript[entry.n]
            problems += _content_problems(entry, original, contents[entry.n], expected[1], facts)
    return problems


def _content_problems(
    entry: Entry,
    original: Mapping[str, Any],
    was: str,
    call: ToolCall,
    facts: Sequence[tuple[int, str, str | None, str]],
) -> list[str]:
    content, n = entry.message.get("content"), entry.n
    tool = _tool(original, call)
    if entry.edit is None or not isinstance(content, str):
        return []  # verbatim entries: coverage_problems compares them with the transcript
    if entry.edit == "pruned":
        ok = content.startswith(PRUNED.format(tool=tool))
    elif entry.edit == "deduplicated":
        pointer = FILE_POINTER.fullmatch(content)
        if pointer is not None:
            path = pointer["path"]
            ok = path == _path(call) and any(m > n and t == tool and p == path for m, t, p, _ in facts)
        else:
            # Compared as the conversation held it (an earlier compaction may have cut both copies).
            ok = content == IDENTICAL.format(tool=tool) and any(
                m > n and t == tool and k == was for m, t, _, k in facts
            )
    elif entry.edit == "truncated":
        text = str(original.get("content"))
        head, _, rest = content.partition("\n[... ")
        tail = rest.split(" ...]\n", 1)[-1]
        ok = text.startswith(head) and text.endswith(tail)
    else:
        ok = False
    return [] if ok else [f"result {n} ({tool} {_path(call)}) holds {content[:80]!r}, not about its own call"]


def _tool(message: Mapping[str, Any], call: ToolCall) -> str:
    name = call.name or message.get("name")
    return name if isinstance(name, str) and name else "tool"


def _path(call: ToolCall) -> str | None:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return None
    path = arguments.get("path") if isinstance(arguments, dict) else None
    return posixpath.normpath(path) if isinstance(path, str) else None


def _key(content: object) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def duplicates_ids(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether some message repeats an id among its parallel tool calls."""
    for m in messages:
        ids = [c.get("id") for c in m.get("tool_calls") or ()]
        if len(ids) != len(set(ids)):
            return True
    return False
