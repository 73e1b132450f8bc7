"""The tool shapes the working state recognises (strategies/tool_shapes.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compaction_worker.strategies.tool_shapes import (
    FileCall,
    Replacement,
    apply_edits,
    failed,
    file_call,
    plan_call,
)


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("read_file", {"path": "a.py"}, FileCall("read", "a.py")),
        (
            "Read",
            {"file_path": "/r/a.py", "offset": 10, "limit": 5},
            FileCall("read", "/r/a.py", part="offset 10, limit 5"),
        ),
        ("view", {"path": "a.py"}, FileCall("read", "a.py")),
        ("cat", {"filename": "a.py"}, FileCall("read", "a.py")),
        ("bash", {"command": "cat src/a.py"}, FileCall("read", "src/a.py")),
        ("shell", {"command": ["bash", "-lc", "cat 'a b.py'"]}, None),
        ("shell", {"command": ["bash", "-lc", "cat a.py"]}, FileCall("read", "a.py")),
        ("bash", {"command": "cat a.py | grep x"}, None),
        (
            "str_replace_based_edit_tool",
            {"command": "view", "path": "a.py", "view_range": [1, 20]},
            FileCall("read", "a.py", part="lines 1-20"),
        ),
        (
            "str_replace_based_edit_tool",
            {"command": "create", "path": "a.py", "file_text": "x"},
            FileCall("write", "a.py", content="x"),
        ),
        ("Write", {"file_path": "a.py", "content": "x"}, FileCall("write", "a.py", content="x")),
        (
            "Edit",
            {"file_path": "a.py", "old_string": "a", "new_string": "b", "replace_all": True},
            FileCall("edit", "a.py", edits=(Replacement("a", "b", every=True),)),
        ),
        (
            "MultiEdit",
            {"file_path": "a.py", "edits": [{"old_string": "a", "new_string": "b"}]},
            FileCall("edit", "a.py", edits=(Replacement("a", "b"),)),
        ),
        (
            "str_replace_editor",
            {"command": "insert", "path": "a.py", "insert_line": 2, "new_str": "z"},
            FileCall("edit", "a.py", edits=(Replacement("", "z", line=2),)),
        ),
        ("search", {"query": "a.py"}, None),
        ("read_file", {"pattern": "*.py"}, None),
    ],
)
def test_file_calls(name: str, args: dict[str, Any], expected: FileCall | None) -> None:
    assert file_call(name, json.dumps(args)) == expected


def test_plan_calls() -> None:
    todos = {"todos": [{"content": "a", "status": "completed"}, {"content": "b", "status": "in_progress"}]}
    assert plan_call("TodoWrite", json.dumps(todos)).text == "- [x] a\n- [~] b (in progress)"  # type: ignore[union-attr]
    assert plan_call("todowrite", json.dumps(todos)) is not None  # OpenCode's spelling
    assert plan_call("anything", json.dumps(todos)) is not None  # a todos list is a plan
    assert plan_call("read_file", json.dumps({"path": "plan.md"})) is None
    assert plan_call("todo_read", "{}") is None
    raw = json.dumps({"goals": ["a"]})
    assert plan_call("set_goals", raw, ["set-goals"]).text == '{\n "goals": [\n  "a"\n ]\n}'  # type: ignore[union-attr]


def test_apply_edits() -> None:
    assert apply_edits("a\nb\n", [Replacement("b", "c")]) == "a\nc\n"
    assert apply_edits("a a", [Replacement("a", "c")]) is None  # not unique
    assert apply_edits("a a", [Replacement("a", "c", every=True)]) == "c c"
    assert apply_edits("a\nb\n", [Replacement("", "z", line=1)]) == "a\nz\nb\n"
    assert apply_edits("a\n", [Replacement("", "z", line=5)]) is None


def test_failed() -> None:
    assert failed("Error: file not found")
    assert failed("<tool_use_error>String to replace not found</tool_use_error>")
    assert not failed("def error_handler():\n    pass")
