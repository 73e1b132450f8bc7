"""Working state restored after a summary (strategies/working_state.py): files and plan, marked, in budget."""

from __future__ import annotations

import dataclasses
from typing import Any

from compaction_worker.contracts.history import (
    RESTORED,
    RESTORED_HEADER,
    SUMMARY_HEADER,
    EffectiveHistory,
    render,
)
from compaction_worker.strategies import provider_problems
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome
from compaction_worker.strategies.working_state import FIELD, restore_working_state
from compaction_worker.testing import Chat, summary_chunk

from .helpers import context, lines

TODOS = {
    "todos": [
        {"content": "Reproduce the bug", "status": "completed", "activeForm": "Reproducing"},
        {"content": "Fix the parser", "status": "in_progress", "activeForm": "Fixing"},
        {"content": "Run the suite", "status": "pending", "activeForm": "Running"},
    ]
}


def compacted(chat: Chat, keep: int, ctx: StageContext | None = None) -> tuple[StageOutcome, StageContext]:
    """The stage after a summary of all but the last ``keep`` entries, as the pipeline runs it."""
    ctx = ctx or context()
    ctx = dataclasses.replace(ctx, originals={e.n: e.message for e in chat.entries})
    split = len(chat.entries) - keep
    draft = Draft((summary_chunk(1, split),), tuple(chat.entries[split:]))
    return restore_working_state(chat.entries, draft, ctx), ctx


def restored(out: StageOutcome) -> dict[str, Any]:
    entry = out.draft.entries[0]
    assert entry.edit == RESTORED
    assert entry.n == 0
    return {"text": str(entry.message["content"]), **entry.message[FIELD]}


class TestFiles:
    def test_a_file_read_in_the_summarized_span_comes_back_verbatim(self) -> None:
        """Its latest content, under the header, inside the summary turn; the provider view has no private field."""
        chat = Chat().user("fix it").tool("c1", "read_file", {"path": "src/a.py"}, "def a():\n    return 1\n")
        chat.assistant("looking").user("go on").assistant("ok")
        out, ctx = compacted(chat, keep=2)
        state = restored(out)
        assert state["text"].startswith(RESTORED_HEADER)
        assert "## File src/a.py (read at turn 3)\n```\ndef a():\n    return 1\n```" in state["text"]
        assert [f["path"] for f in state["files"]] == ["src/a.py"]
        assert out.report is not None
        assert out.report.tokens_saved == -out.draft.entries[0].tokens
        assert ctx.tokens(out.draft) <= ctx.limits.target
        messages = render(EffectiveHistory(out.draft.chunks, out.draft.entries))
        assert messages[0]["content"].startswith(SUMMARY_HEADER)
        assert RESTORED_HEADER in messages[0]["content"]
        assert not any(FIELD in m for m in messages)
        assert provider_problems(messages) == []

    def test_a_file_still_in_the_tail_is_not_repeated(self) -> None:
        chat = Chat().user("fix it").tool("c1", "read_file", {"path": "a.py"}, "old body")
        chat.user("again").tool("c2", "Read", {"file_path": "a.py"}, "new body").assistant("ok")
        out, _ = compacted(chat, keep=4)
        assert out.report is None
        assert out.draft.entries[0].edit is None

    def test_edits_apply_to_the_content_read_and_writes_replace_it(self) -> None:
        """A str_replace on a numbered read (Claude Code's Read) gives the file after the edit; a write its content."""
        chat = Chat().user("fix it")
        chat.tool("c1", "Read", {"file_path": "a.py"}, "     1\tx = 1\n     2\ty = 2\n")
        chat.tool("c2", "Edit", {"file_path": "a.py", "old_string": "y = 2", "new_string": "y = 3"}, "ok")
        chat.tool("c3", "write_file", {"path": "b.py", "content": "print('b')"}, "written")
        chat.user("go on").assistant("ok")
        state = restored(compacted(chat, keep=2)[0])
        texts = {f["path"]: f["content"] for f in state["files"]}
        assert texts == {"a.py": "x = 1\ny = 3\n", "b.py": "print('b')"}
        assert [f["path"] for f in state["files"]] == ["b.py", "a.py"]  # the most recent first

    def test_an_edit_that_cannot_be_placed_is_a_pointer(self) -> None:
        chat = Chat().user("fix it").tool("c1", "read_file", {"path": "a.py"}, "x = 1")
        chat.tool("c2", "str_replace", {"path": "a.py", "old_str": "zzz", "new_str": "q"}, "ok")
        chat.user("go on").assistant("ok")
        state = restored(compacted(chat, keep=2)[0])
        assert "## File a.py (edited at turn 4): its content is not known here" in state["text"]

    def test_a_file_too_large_becomes_a_pointer_with_its_size(self) -> None:
        chat = Chat().user("fix it").tool("c1", "read_file", {"path": "big.log"}, lines(2000))
        chat.tool("c2", "view", {"path": "small.py"}, "pass").user("go on").assistant("ok")
        state = restored(compacted(chat, keep=2, ctx=context(working_state_file_max_tokens=500))[0])
        assert "## File big.log (read at turn 3): 2,000 lines, " in state["text"]
        assert "too large to restore here" in state["text"]
        assert "line 1999" not in state["text"]
        assert "## File small.py (read at turn 5)\n```\npass\n```" in state["text"]

    def test_failed_reads_and_excess_files_are_left_out(self) -> None:
        chat = Chat().user("fix it").tool("c0", "read_file", {"path": "gone.py"}, "Error: no such file")
        for i in range(4):
            chat.tool(f"c{i + 1}", "cat", {"path": f"f{i}.py"}, f"body {i}")
        chat.user("go on").assistant("ok")
        state = restored(compacted(chat, keep=2, ctx=context(working_state_max_files=2))[0])
        assert [f["path"] for f in state["files"]] == ["f3.py", "f2.py"]

    def test_the_budget_bounds_it_and_the_target_counts_it(self) -> None:
        """Nothing past ``working_state_max_tokens``, nor past the room under the target."""
        chat = Chat().user("fix it").tool("c1", "read_file", {"path": "a.py"}, lines(300))
        chat.user("go on").assistant("ok")
        out, _ = compacted(chat, keep=2, ctx=context(working_state_max_tokens=100))
        assert "too large" in restored(out)["text"]
        assert out.draft.entries[0].tokens <= 100
        tight = context(target=30)
        assert compacted(chat, keep=2, ctx=tight)[0].report is None


class TestPlan:
    def test_the_latest_todo_list_comes_back_as_a_checklist(self) -> None:
        chat = Chat().user("fix it").tool("t1", "TodoWrite", {"todos": []}, "ok")
        chat.tool("t2", "TodoWrite", TODOS, "Todos have been modified successfully")
        chat.user("go on").assistant("ok")
        state = restored(compacted(chat, keep=2)[0])
        checklist = "- [x] Reproduce the bug\n- [~] Fix the parser (in progress)\n- [ ] Run the suite"
        assert f"## Plan (TodoWrite, turn 4)\n{checklist}" in state["text"]
        assert state["plan"]["tool"] == "TodoWrite"

    def test_update_plan_and_a_runtime_named_plan_tool(self) -> None:
        plan = {
            "explanation": "two steps",
            "plan": [{"step": "Read", "status": "completed"}, {"step": "Fix"}],
        }
        chat = (
            Chat().user("fix it").tool("p", "update_plan", plan, "Plan updated").user("go on").assistant("ok")
        )
        assert "two steps\n- [x] Read\n- [ ] Fix" in restored(compacted(chat, keep=2)[0])["text"]
        own = (
            Chat().user("fix it").tool("p", "set_goals", {"goals": ["a"]}, "ok").user("go on").assistant("ok")
        )
        assert compacted(own, keep=2)[0].report is None
        out = compacted(own, keep=2, ctx=context(plan_tools=["set_goals"]))[0]
        assert '"goals"' in restored(out)["text"]

    def test_a_plan_still_in_the_tail_is_not_repeated(self) -> None:
        chat = Chat().user("fix it").user("go on").tool("t", "write_todos", TODOS, "ok").assistant("ok")
        assert compacted(chat, keep=3)[0].report is None


def test_the_next_compaction_carries_what_its_span_does_not_renew() -> None:
    """A file restored once stays restored; a newer read of another file joins it; the old entry goes."""
    chat = Chat().user("fix it").tool("c1", "read_file", {"path": "a.py"}, "A").user("go on").assistant("ok")
    first, _ = compacted(chat, keep=2)
    later = Chat(start=len(chat.entries) + 1).tool("c2", "read_file", {"path": "b.py"}, "B")
    later.user("more").assistant("ok")
    before = (*first.draft.entries, *later.entries)
    ctx = dataclasses.replace(context(), originals={e.n: e.message for e in before if e.n})
    draft = Draft((summary_chunk(1, later.entries[1].n - 1),), tuple(later.entries[2:]))
    second = restore_working_state(before, draft, ctx)
    state = restored(second)
    assert [f["path"] for f in state["files"]] == ["b.py", "a.py"]
    assert [e.edit for e in second.draft.entries].count(RESTORED) == 1
