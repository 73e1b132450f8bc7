"""De-duplication: earlier reads of a file, and earlier identical tool outputs, point to the latest.

Reference 004 (stage 2, "File Read Deduplication"), widened to identical outputs of any
tool. No LLM call, and lossless: what an earlier result held is still in the history,
in a later result. Rules:

- Only tool results are rewritten (the reference also rewrites assistant messages that
  mention a read, which would erase the assistant's own words).
- A *file read* is a tool call whose verb is not a mutation (the ``command`` argument
  when it is one word, as in ``{"command": "view", "path": ...}``, else the tool name;
  ``write``, ``edit``, ``create`` ... are mutations) and that names a path: an argument
  ``path``, ``file_path``, ``filename``, ``file`` ... or, failing that, reference 004's
  regex (``read|cat|read_file ... <path>``) over the call's argument values or the first
  line of the result. A later read of the same path by the same tool supersedes an
  earlier one when it has no other arguments (a whole-file read) or exactly the same
  other arguments (the same range); a regex-found read is superseded only by the same
  call, since the text around the path (``| head``) may limit what was read.
  The earlier one becomes ``[File <path> - refer to the latest read below]``.
- An *identical output* is a result with the same tool and exactly the same content as a
  later one; the earlier one becomes ``[Identical to a later <tool> output below]``.
- The later copy must hold its content: a placeholder never counts as one, and a
  head/tail-truncated read does not supersede a full one (it lacks the middle).
- Pinned entries are never rewritten (they still count as later copies).
- Each result is judged by its own call, paired by position (runtimes reuse ``call_0`` in
  every turn): a pointer names the path its own call read, never another call's.

Minimum saving: reference 004 applies a read-dedup only when it saves 30% of the
characters of the messages it replaces, in aggregate. Here the 30% is per entry (see
:data:`~compaction_worker.strategies.edits.MIN_ENTRY_SAVING`), so short outputs do not
ride along with long ones. There is no minimum for the stage as a whole: unlike pruning
it loses nothing, so any saving is worth having.

Placeholders are strings, so an earlier result with images loses them too; that only
happens when the later copy has the same images (identical content) or is a re-read.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from compaction_worker.contracts.history import Entry, text_of
from compaction_worker.contracts.toolpairs import ToolCall
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome
from compaction_worker.strategies.edits import (
    PLACEHOLDER_EDITS,
    outcome,
    plural,
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


def file_read(call: ToolCall | None, entry: Entry, tool: str) -> ReadKey | None:
    """Which read a tool result is, or None when its call does not read a file."""
    arguments = _arguments(call.arguments) if call is not None else {}
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


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return dict(value) if isinstance(value, Mapping) else {}


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
