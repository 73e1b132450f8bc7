"""Which tool calls read or change a file, or set the agent's plan: the shapes agents use.

Recognised by tool name (case, ``_`` and ``-`` ignored) and argument names, the way
Claude Code (``Read``/``Write``/``Edit``/``MultiEdit``/``TodoWrite``), Anthropic's text
editor tool (``str_replace_based_edit_tool`` with a ``command``), Codex (``update_plan``,
a shell running ``cat``), LangChain deep agents (``read_file``/``write_file``/
``edit_file``/``write_todos``), OpenCode and most hand-written agents (``read_file``,
``view``, ``cat``) name them. A runtime names its own plan tool in
``pipeline.plan_tools``; any call with a ``todos`` list is a plan too.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from compaction_worker.contracts.toolpairs import arguments_object

FileOp = Literal["read", "write", "edit"]


@dataclass(frozen=True, slots=True)
class Replacement:
    """One edit: ``old`` replaced by ``new`` (every occurrence when ``every``); ``old`` empty with
    ``line`` set inserts ``new`` after that line."""

    old: str
    new: str
    every: bool = False
    line: int | None = None


@dataclass(frozen=True, slots=True)
class FileCall:
    """A call that reads, writes or edits one file."""

    op: FileOp
    path: str
    content: str | None = None
    """What a write puts in the file."""
    edits: tuple[Replacement, ...] = ()
    part: str | None = None
    """A read of part of the file: which part (``lines 10-40``)."""


@dataclass(frozen=True, slots=True)
class PlanCall:
    """A call whose arguments are the agent's plan, as a checklist."""

    tool: str
    text: str


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_READ = {
    "read",
    "readfile",
    "view",
    "viewfile",
    "cat",
    "openfile",
    "readtextfile",
    "getfilecontents",
    "fileread",
}
_WRITE = {"write", "writefile", "create", "createfile", "filewrite", "writetofile", "writetextfile"}
_EDIT = {
    "edit",
    "editfile",
    "strreplace",
    "multiedit",
    "replaceinfile",
    "fileedit",
    "insert",
    "searchreplace",
}
_EDITOR = {"strreplacebasededittool", "strreplaceeditor", "texteditor", "editor", "fileeditor"}
"""Tools that take a ``command`` (Anthropic's text editor, OpenHands): view, create, str_replace, insert."""
_SHELL = {"bash", "shell", "terminal", "runterminalcmd", "exec", "executecommand", "runcommand", "localshell"}
_PLAN = {"todowrite", "updateplan", "writetodos", "todoupdate", "updatetodos", "updatetodolist", "setplan"}
_PATH_KEYS = (
    "path",
    "filepath",
    "filename",
    "file",
    "targetfile",
    "absolutepath",
    "relativepath",
    "targetpath",
)
_CONTENT_KEYS = ("content", "contents", "filetext", "text", "data")
_RANGE_KEYS = ("offset", "limit", "viewrange", "startline", "endline", "linestart", "lineend", "lines")
_CAT = re.compile(r"^\s*cat\s+(?P<path>[^\s|;&<>]+)\s*$")


def _arguments(raw: str) -> dict[str, Any]:
    """The call's arguments by normalised key (empty when they are not a JSON object)."""
    return {_norm(str(k)): v for k, v in arguments_object(raw).items()}


def _text(args: Mapping[str, Any], keys: Iterable[str]) -> str | None:
    return next((v for k in keys if isinstance(v := args.get(k), str)), None)


def file_call(name: str, raw_arguments: str) -> FileCall | None:
    """What a call does to a file, if it reads, writes or edits one."""
    tool, args = _norm(name), _arguments(raw_arguments)
    if tool in _SHELL:
        return _shell_read(args.get("command") or args.get("cmd"))
    path = _text(args, _PATH_KEYS)
    if not path or not path.strip():
        return None
    path = path.strip()
    command = _norm(str(args.get("command") or "")) if tool in _EDITOR else ""
    if tool in _READ or command == "view":
        return FileCall("read", path, part=_part(args))
    if tool in _WRITE or command == "create":
        content = _text(args, _CONTENT_KEYS)
        return FileCall("write", path, content=content) if content is not None else FileCall("edit", path)
    if tool in _EDIT or command in ("strreplace", "insert", "undoedit"):
        return FileCall("edit", path, edits=tuple(_edits(args)) if command != "undoedit" else ())
    return None


def _shell_read(command: Any) -> FileCall | None:
    """``cat FILE`` run in a shell (a string, or an argv such as ``["bash", "-lc", "cat x"]``)."""
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        command = command[-1] if len(command) > 1 and command[-2] in ("-c", "-lc") else shlex.join(command)
    match = _CAT.match(command) if isinstance(command, str) else None
    return FileCall("read", match["path"].strip("'\"")) if match else None


def _part(args: Mapping[str, Any]) -> str | None:
    given = {k: args[k] for k in _RANGE_KEYS if args.get(k) not in (None, "", [])}
    if not given:
        return None
    if isinstance(given.get("viewrange"), list):
        first, *rest = given["viewrange"] + [None]
        return f"lines {first}-{rest[0]}" if rest[0] not in (None, -1) else f"lines {first}-end"
    return ", ".join(f"{k} {v}" for k, v in given.items())


def _edits(args: Mapping[str, Any]) -> Iterable[Replacement]:
    listed = args.get("edits")
    for edit in listed if isinstance(listed, list) else [args]:
        if not isinstance(edit, Mapping):
            continue
        keys = {_norm(str(k)): v for k, v in edit.items()}
        old = _text(keys, ("oldstr", "oldstring", "old", "search", "oldtext"))
        new = _text(keys, ("newstr", "newstring", "new", "replace", "newtext", "inserttext", "text"))
        line = keys.get("insertline")
        if old is not None and new is not None:
            yield Replacement(old, new, every=bool(keys.get("replaceall")))
        elif isinstance(line, int) and new is not None:
            yield Replacement("", new, line=line)


def plan_call(name: str, raw_arguments: str, extra_tools: Sequence[str] = ()) -> PlanCall | None:
    """The plan a call sets, if it is a plan tool (a known name, one of ``extra_tools``, or a ``todos`` list)."""
    tool, args = _norm(name), _arguments(raw_arguments)
    items = next(
        (v for k in ("todos", "plan", "items", "tasks", "steps") if isinstance(v := args.get(k), list)), None
    )
    named = tool in _PLAN or tool in {_norm(t) for t in extra_tools}
    if not named and not isinstance(args.get("todos"), list):
        return None
    lines = [_item(item) for item in items] if items is not None else []
    if items is None or not all(lines):
        lines = (
            [json.dumps(json.loads(raw_arguments), ensure_ascii=False, indent=1)] if args else [raw_arguments]
        )
    note = _text(args, ("explanation", "summary", "note"))
    return PlanCall(name, "\n".join([*([note] if note else []), *lines]))


_MARKS = {"completed": "[x]", "done": "[x]", "inprogress": "[~]", "active": "[~]", "cancelled": "[-]"}


def _item(item: Any) -> str:
    """One checklist line (empty when the item is no step)."""
    if isinstance(item, str):
        return f"- [ ] {item}"
    if not isinstance(item, Mapping):
        return ""
    keys = {_norm(str(k)): v for k, v in item.items()}
    text = _text(keys, ("content", "step", "text", "title", "task", "description", "name"))
    if text is None:
        return ""
    status = _norm(str(keys.get("status") or keys.get("state") or ""))
    mark = _MARKS.get(status, "[x]" if keys.get("done") is True or keys.get("completed") is True else "[ ]")
    return f"- {mark} {text}" + (" (in progress)" if mark == "[~]" else "")


_LINE_NUMBERS = re.compile(r"^ *\d+(\t|→)", re.MULTILINE)


def apply_edits(content: str, edits: Sequence[Replacement]) -> str | None:
    """``content`` after ``edits``, or None when one cannot be placed (its text is not there exactly once).

    A read that numbered its lines (``cat -n``, Claude Code's Read) is unnumbered first, so
    the edit's text can match.
    """
    lines = content.splitlines(keepends=True)
    if lines and all(_LINE_NUMBERS.match(line) for line in lines if line.strip()):
        content = "".join(_LINE_NUMBERS.sub("", line, count=1) for line in lines)
    for edit in edits:
        if edit.line is not None:
            rows = content.splitlines(keepends=True)
            if not 0 <= edit.line <= len(rows):
                return None
            new = edit.new if edit.new.endswith("\n") else edit.new + "\n"
            content = "".join([*rows[: edit.line], new, *rows[edit.line :]])
        elif edit.old and (content.count(edit.old) == 1 or (edit.every and edit.old in content)):
            content = content.replace(edit.old, edit.new)
        else:
            return None
    return content


_FAILED = re.compile(
    r"^\s*(error\b|failed\b|no such file|enoent|file not found|<tool_use_error>)", re.IGNORECASE
)


def failed(result: str) -> bool:
    """Whether a tool result reports that the call failed (then it changed and showed nothing)."""
    return bool(_FAILED.match(result[:200]))
