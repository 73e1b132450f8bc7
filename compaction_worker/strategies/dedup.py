"""The deduplicate stage: earlier reads of a file, and earlier identical tool outputs, point to the latest.

Lossless (the later copy holds the content) and judged per result by its own call.
"""

from __future__ import annotations

import json
import posixpath
import re

from compaction_worker.contracts.history import Entry, text_of
from compaction_worker.contracts.toolpairs import ToolCall, arguments_object
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, plural
from compaction_worker.strategies.edits import (
    PLACEHOLDER_EDITS,
    EditStage,
    outcome,
    rewrite,
    tool_calls,
    tool_name,
    worth_it,
)

EDIT = "deduplicated"
STAGE = "deduplicate"

PATH_KEYS = ("path", "file_path", "filepath", "filename", "file_name", "file", "target_file", "absolute_path")
# Not "mode": that is usually a file-open mode ("w"), which no verb pattern would catch.
VERB_KEYS = ("command", "action", "operation")
FIRST_LINE_CHARS = 500
"""How much of a result's start can hold the line that names what it read."""
MUTATION = re.compile(
    r"write|edit|create|delete|remove|patch|replace|insert|append|move|rename|update|apply|save|upload|undo",
    re.IGNORECASE,
)
# Reference 004's pattern, with a word boundary added so "thread x.py" is not "read x.py".
READ_PATTERN = re.compile(
    r"\b(?:read|reading|read_file|readFile|Read file|cat)\s+['\"`]?([^\s'\"`\n]+)", re.I
)

ReadKey = tuple[str, str, str]
"""(tool, path, other arguments): which reads are the same read."""


def deduplicate(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Rewrite tool results that a later result repeats (a re-read file or an identical output)."""
    entries = draft.entries
    calls = tool_calls(entries)
    later_reads: set[ReadKey] = set()
    later_outputs: set[tuple[str, str]] = set()
    edited: dict[int, Entry] = {}
    reads = identical = 0
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        content = entry.message.get("content")
        if entry.role != "tool" or entry.edit in PLACEHOLDER_EDITS or not content:
            continue
        call = calls.get(i)
        tool = tool_name(entry, call)
        read = file_read(call, entry, tool)
        output = (tool, _content_key(content))
        reread = read is not None and ((tool, read[1], "") in later_reads or read in later_reads)
        repeated = output in later_outputs
        if read is not None and entry.edit != "truncated":
            later_reads.add(read)
        later_outputs.add(output)
        if entry.pinned or not (reread or repeated):
            continue
        text = (
            f"[File {read[1]} - refer to the latest read below]"
            if read is not None and reread
            else f"[Identical to a later {tool} output below]"
        )
        new = rewrite(entry, text, EDIT, ctx)
        if worth_it(entry, new):
            edited[i] = new
            reads += reread
            identical += not reread
    parts = [plural(reads, "earlier file read")] if reads else []
    parts += [plural(identical, "identical output")] if identical else []
    return outcome(draft, ctx, edited, STAGE, ", ".join(parts))


DEDUPLICATE = EditStage(STAGE, deduplicate)
"""The stage as the pipeline runs it."""


def file_read(call: ToolCall | None, entry: Entry, tool: str) -> ReadKey | None:
    """Which read a tool result is, or None when its call does not read a file."""
    arguments = arguments_object(call.arguments) if call is not None else {}
    verb_key = next((k for k in VERB_KEYS if _is_word(arguments.get(k))), None)
    verb = str(arguments[verb_key]) if verb_key else tool
    if MUTATION.search(verb):
        return None
    path_key = next(
        (k for k in PATH_KEYS if isinstance(arguments.get(k), str) and arguments[k].strip()), None
    )
    if path_key is not None:
        rest = {k: v for k, v in arguments.items() if k not in (path_key, verb_key)}
        other = json.dumps(rest, sort_keys=True, separators=(",", ":")) if rest else ""
        return tool, _normalize(arguments[path_key]), other
    # No path argument: the reference's regex, first over what the call asked for, then
    # over the result's first line only (prose further down mentions files all the time).
    texts = [f"{tool} {v}" for v in arguments.values() if isinstance(v, str)]
    texts.append(text_of(entry.message)[:FIRST_LINE_CHARS].split("\n", 1)[0])
    for text in texts:
        match = READ_PATTERN.search(text)
        if match and ("/" in match[1] or "." in match[1]):
            # Keyed by the exact call: only the same call re-run supersedes this read.
            exact = call.arguments if call is not None else text
            return tool, _normalize(match[1]), f"call:{exact}"
    return None


def _is_word(value: object) -> bool:
    return isinstance(value, str) and bool(value) and not any(c.isspace() for c in value)


def _normalize(path: str) -> str:
    """One spelling per path: ``./src//a.py`` and ``src/a.py`` are the same file."""
    path = path.strip()
    return posixpath.normpath(path) if path else path


def _content_key(content: object) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
