"""De-duplication of repeated file reads and identical tool outputs (strategies/dedup.py)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_worker.contracts.history import EffectiveHistory, render
from compaction_worker.strategies import provider_problems
from compaction_worker.strategies.dedup import deduplicate
from compaction_worker.strategies.draft import Draft
from compaction_worker.testing import Chat

from .helpers import COUNTER, IMAGE, by_n, chunk, context, words

EDITOR = "str_replace_based_edit_tool"


def reread(first: dict[str, Any], second: dict[str, Any], tool: str = "read_file") -> Chat:
    """Two reads (n=3 and n=6) of 200 different words each, an assistant message between."""
    chat = Chat().user().tool("a", tool, first, words(200, "old")).assistant("ok")
    return chat.tool("b", tool, second, words(200, "new")).user()


def edits(draft: Draft) -> dict[int, str]:
    return {e.n: str(e.message["content"]) for e in draft.entries if e.edit == "deduplicated"}


class TestFileReads:
    def test_earlier_read_points_to_the_latest(self) -> None:
        """Reference 004 (stage 2): an earlier read of the same path is replaced by a pointer to the latest read."""
        chat = reread({"path": "a.py"}, {"path": "a.py"})
        ctx = context()
        out = deduplicate(chat.draft(), ctx)
        assert edits(out.draft) == {3: "[File a.py - refer to the latest read below]"}
        assert by_n(out.draft)[6] == chat.entries[5]
        assert out.report is not None
        assert (out.report.stage, out.report.detail) == ("deduplicate", "1 earlier file read")
        # 204 tokens become 9 words plus 4.
        assert out.report.tokens_saved == 204 - 13 == ctx.tokens(chat.draft()) - ctx.tokens(out.draft)
        assert by_n(out.draft)[3].tokens == COUNTER.message(by_n(out.draft)[3].message)

    @pytest.mark.parametrize("key", ["file_path", "filename", "file"])
    def test_path_argument_names_and_spellings(self, key: str) -> None:
        """The path comes from the usual argument names, and ./src//a.py is the same file as src/a.py."""
        out = deduplicate(reread({key: "./src//a.py"}, {key: "src/a.py"}).draft(), context())
        assert edits(out.draft) == {3: "[File src/a.py - refer to the latest read below]"}

    def test_other_paths_are_not_duplicates(self) -> None:
        """Reads of different files both stay."""
        assert deduplicate(reread({"path": "a.py"}, {"path": "b.py"}).draft(), context()).report is None

    def test_a_different_range_does_not_supersede(self) -> None:
        """Reading lines 50-100 does not make an earlier read of lines 0-50 redundant."""
        chat = reread({"path": "a.py", "offset": 0, "limit": 50}, {"path": "a.py", "offset": 50, "limit": 50})
        assert deduplicate(chat.draft(), context()).report is None

    def test_the_same_range_and_a_whole_read_supersede(self) -> None:
        """A later read of the same range, or of the whole file, makes earlier range reads redundant."""
        chat = Chat().user()
        chat.tool("a", "read_file", {"path": "a.py", "offset": 0}, words(200, "a"))
        chat.tool("b", "read_file", {"path": "a.py", "offset": 9}, words(200, "b"))
        chat.tool("c", "read_file", {"path": "a.py", "offset": 9}, words(200, "c"))
        chat.tool("d", "read_file", {"path": "a.py"}, words(200, "d")).user()
        out = deduplicate(chat.draft(), context())
        assert sorted(edits(out.draft)) == [3, 5, 7]

    def test_reads_by_another_tool_do_not_supersede(self) -> None:
        """A grep over a file is not made redundant by a later read_file of it."""
        chat = Chat().user().tool("g", "grep", {"path": "a.py"}, words(200, "g"))
        chat.tool("r", "read_file", {"path": "a.py"}, words(200, "r")).user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_editor_view_is_a_read_and_its_edits_are_not(self) -> None:
        """A one-word command argument decides: "view" reads, "str_replace" writes."""
        chat = reread({"command": "view", "path": "a.py"}, {"command": "view", "path": "a.py"}, tool=EDITOR)
        assert sorted(edits(deduplicate(chat.draft(), context()).draft)) == [3]
        chat = Chat().user().tool("a", EDITOR, {"command": "str_replace", "path": "a.py"}, words(200, "x"))
        chat.tool("b", EDITOR, {"command": "str_replace", "path": "a.py"}, words(200, "y")).user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_writes_are_not_reads(self) -> None:
        """Two write_file calls to one path are not re-reads, and neither supersedes a read."""
        chat = Chat().user().tool("r", "read_file", {"path": "a.py"}, words(200, "r"))
        chat.tool("w1", "write_file", {"path": "a.py"}, words(200, "w1"))
        chat.tool("w2", "write_file", {"path": "a.py"}, words(200, "w2")).user()
        assert deduplicate(chat.draft(), context()).report is None


class TestRegexFallback:
    def test_cat_in_a_command_is_a_read(self) -> None:
        """Reference 004's regex finds the path in a shell command; the same command re-run supersedes."""
        chat = reread({"command": "cat src/a.py"}, {"command": "cat src/a.py"}, tool="run_command")
        assert edits(deduplicate(chat.draft(), context()).draft) == {
            3: "[File src/a.py - refer to the latest read below]"
        }

    def test_a_different_command_on_the_same_file_does_not_supersede(self) -> None:
        """``cat a.py | head`` reads less than ``cat a.py``, so it does not replace it."""
        chat = reread({"command": "cat src/a.py"}, {"command": "cat src/a.py | head -5"}, tool="run_command")
        assert deduplicate(chat.draft(), context()).report is None

    def test_first_line_of_the_result(self) -> None:
        """A result whose first line says what it read counts as a read of that path."""
        chat = Chat().user().tool("a", "fetch", {"id": 7}, "Reading docs/guide.md\n" + words(200, "a"))
        chat.tool("b", "fetch", {"id": 7}, "Reading docs/guide.md\n" + words(200, "b")).user()
        assert edits(deduplicate(chat.draft(), context()).draft) == {
            3: "[File docs/guide.md - refer to the latest read below]"
        }

    @pytest.mark.parametrize("first_line", ["spawned thread pool.py", "read the docs", "cat"])
    def test_words_that_only_look_like_reads(self, first_line: str) -> None:
        """A word ending in "read" is not a read, and a read needs something path-like after it."""
        chat = Chat().user().tool("a", "fetch", {"id": 7}, f"{first_line}\n" + words(200, "a"))
        chat.tool("b", "fetch", {"id": 7}, f"{first_line}\n" + words(200, "b")).user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_paths_mentioned_further_down_are_not_reads(self) -> None:
        """Prose below the first line ("then read a.py") does not make a result a file read."""
        chat = Chat().user().tool("a", "fetch", {"id": 7}, "Notes\nthen read a.py " + words(200, "a"))
        chat.tool("b", "fetch", {"id": 7}, "Notes\nthen read a.py " + words(200, "b")).user()
        assert deduplicate(chat.draft(), context()).report is None


class TestIdenticalOutputs:
    def test_identical_output_of_the_same_tool_keeps_the_latest(self) -> None:
        """Two identical run_command outputs: the earlier points to the later."""
        chat = Chat().user().tool("a", "run_command", {"command": "pytest"}, words(200))
        chat.tool("b", "run_command", {"command": "pytest -x"}, words(200)).user()
        out = deduplicate(chat.draft(), context())
        assert edits(out.draft) == {3: "[Identical to a later run_command output below]"}
        assert out.report is not None
        assert out.report.detail == "1 identical output"
        assert out.report.tokens_saved == 204 - 11

    def test_same_content_from_another_tool_is_kept(self) -> None:
        """Identical text from two different tools is not a duplicate."""
        chat = (
            Chat().user().tool("a", "run_command", {}, words(200)).tool("b", "shell", {}, words(200)).user()
        )
        assert deduplicate(chat.draft(), context()).report is None

    def test_identical_list_contents_with_images(self) -> None:
        """Identical text-and-image outputs are duplicates; the placeholder is a string, re-counted."""
        content = [{"type": "text", "text": words(50)}, IMAGE]
        chat = (
            Chat()
            .user()
            .tool("a", "screenshot", {}, content)
            .tool("b", "screenshot", {}, list(content))
            .user()
        )
        out = deduplicate(chat.draft(), context())
        entry = by_n(out.draft)[3]
        assert entry.message["content"] == "[Identical to a later screenshot output below]"
        assert entry.tokens == 11


class TestWhatIsKept:
    def test_short_outputs_are_not_rewritten(self) -> None:
        """Reference 004 (30% saving, here per entry): below a 30% saving an earlier read stays."""
        chat = Chat().user().tool("a", "read_file", {"path": "a.py"}, words(12, "a"))
        chat.tool("b", "read_file", {"path": "a.py"}, words(12, "b")).user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_a_truncated_later_read_does_not_supersede(self) -> None:
        """A head/tail-cut read lacks the middle, so the earlier full read stays."""
        chat = Chat().user().tool("a", "read_file", {"path": "a.py"}, words(200, "a"))
        chat.calls(("b", "read_file", {"path": "a.py"})).result("b", words(150, "b"), edit="truncated").user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_a_placeholder_is_not_a_later_copy(self) -> None:
        """When the later read was pruned, the earlier one is the only content left and stays."""
        chat = Chat().user().tool("a", "read_file", {"path": "a.py"}, words(200, "a"))
        chat.calls(("b", "read_file", {"path": "a.py"})).result(
            "b", "[Old tool result cleared]", edit="pruned"
        )
        assert deduplicate(chat.user().draft(), context()).report is None

    def test_pinned_reads_stay_and_still_supersede(self) -> None:
        """A pinned earlier read is never rewritten; a pinned later read makes earlier ones redundant."""
        chat = (
            Chat()
            .user()
            .calls(("a", "read_file", {"path": "a.py"}))
            .result("a", words(200, "a"), pinned=True)
        )
        chat.tool("b", "read_file", {"path": "a.py"}, words(200, "b"))
        chat.calls(("c", "read_file", {"path": "a.py"})).result("c", words(200, "c"), pinned=True).user()
        out = deduplicate(chat.draft(), context())
        assert sorted(edits(out.draft)) == [5]
        assert by_n(out.draft)[3] == chat.entries[2]

    def test_assistant_messages_are_never_rewritten(self) -> None:
        """Only tool results change, even when an assistant message repeats itself word for word."""
        chat = (
            Chat().user().assistant("I read a.py " + words(200)).user().assistant("I read a.py " + words(200))
        )
        assert deduplicate(chat.user().draft(), context()).report is None


class TestReusedIds:
    """Runtimes that number calls per turn (``call_0``, ``call_1`` in every message), issue 9."""

    def test_a_pointer_never_names_another_calls_file(self) -> None:
        """The bug of issue 9: a.py's output (call_0 of turn one) became "[File /src/b.py ...]"
        because turn two's call_0 read b.py, and a.py's content was lost. Now only turn one's
        read of b.py points to the later one."""
        chat = Chat().user()
        chat.calls(
            ("call_0", "read_file", {"path": "/src/a.py"}), ("call_1", "read_file", {"path": "/src/b.py"})
        )
        chat.result("call_0", words(200, "a")).result("call_1", words(200, "b"))
        chat.user().tool("call_0", "read_file", {"path": "/src/b.py"}, words(200, "b2")).user()
        out = deduplicate(chat.draft(), context())
        assert edits(out.draft) == {4: "[File /src/b.py - refer to the latest read below]"}
        assert by_n(out.draft)[3] == chat.entries[2]

    def test_identical_outputs_of_different_tools_sharing_an_id_stay(self) -> None:
        """The same text from run_command (turn one's call_0) and search (turn two's call_0) is
        not "identical to a later search output": the earlier one is no search output."""
        chat = Chat().user().tool("call_0", "run_command", {"command": "grep -r x"}, words(200))
        chat.user().tool("call_0", "search", {"query": "x"}, words(200)).user()
        assert deduplicate(chat.draft(), context()).report is None

    def test_parallel_calls_sharing_an_id_keep_their_own_files(self) -> None:
        """Two parallel call_0 reads (a.py then b.py): only b.py's result points to b.py's re-read."""
        chat = Chat().user()
        chat.calls(("call_0", "read_file", {"path": "a.py"}), ("call_0", "read_file", {"path": "b.py"}))
        chat.result("call_0", words(200, "a")).result("call_0", words(200, "b"))
        chat.user().tool("call_0", "read_file", {"path": "b.py"}, words(200, "b2")).user()
        out = deduplicate(chat.draft(), context())
        assert edits(out.draft) == {4: "[File b.py - refer to the latest read below]"}

    def test_an_orphan_result_is_judged_by_itself(self) -> None:
        """A result whose call_0 is already answered is no read of that call's file."""
        chat = Chat().user().tool("call_0", "read_file", {"path": "a.py"}, words(200, "a"))
        chat.result("call_0", words(200, "x")).user()
        chat.tool("call_0", "read_file", {"path": "a.py"}, words(200, "a2")).user()
        out = deduplicate(chat.draft(), context())
        assert edits(out.draft) == {3: "[File a.py - refer to the latest read below]"}


class TestEdits:
    def test_parallel_calls_pair_each_result_with_its_own_call(self) -> None:
        """Of two parallel reads, only the one whose file is read again later is rewritten."""
        chat = Chat().user().calls(("a", "read_file", {"path": "a.py"}), ("b", "read_file", {"path": "b.py"}))
        chat.result("a", words(200, "a")).result("b", words(200, "b"))
        chat.tool("c", "read_file", {"path": "a.py"}, words(200, "c")).user()
        out = deduplicate(chat.draft(), context())
        assert edits(out.draft) == {3: "[File a.py - refer to the latest read below]"}
        assert [(e.n, e.message.get("tool_call_id")) for e in out.draft.entries] == [
            (e.n, e.message.get("tool_call_id")) for e in chat.entries
        ]
        assert provider_problems(render(EffectiveHistory((), out.draft.entries))) == []

    def test_both_kinds_in_one_report(self) -> None:
        """The detail counts re-read files and identical outputs separately."""
        chat = reread({"path": "a.py"}, {"path": "a.py"})
        chat.tool("x", "run_command", {}, words(200)).tool("y", "run_command", {}, words(200)).user()
        out = deduplicate(chat.draft(), context())
        assert out.report is not None
        assert out.report.detail == "1 earlier file read, 1 identical output"

    def test_summary_chunks_pass_through(self) -> None:
        """The draft's summary chunks are kept as they are."""
        chat = Chat(start=2).user().tool("a", "read_file", {"path": "a.py"}, words(200, "a"))
        chat.tool("b", "read_file", {"path": "a.py"}, words(200, "b")).user()
        out = deduplicate(chat.draft((chunk(),)), context())
        assert out.report is not None
        assert out.draft.chunks == (chunk(),)

    def test_idempotent(self) -> None:
        """De-duplicating a de-duplicated draft changes nothing and reports nothing."""
        chat = reread({"path": "a.py"}, {"path": "a.py"})
        chat.tool("x", "run_command", {}, words(200)).tool("y", "run_command", {}, words(200)).user()
        once = deduplicate(chat.draft(), context())
        twice = deduplicate(once.draft, context())
        assert twice.report is None
        assert twice.draft == once.draft
