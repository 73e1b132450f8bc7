"""Head/tail truncation of oversized single messages (strategies/oversized.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction_worker.contracts.history import Entry
from compaction_worker.strategies.draft import Draft, Limits, StageContext
from compaction_worker.strategies.oversized import cut_text, truncate_oversized
from compaction_worker.testing import Chat

from .helpers import COUNTER, IMAGE, by_n, chunk, context, lines, words

# A 10k window: over 2,500 tokens a message is huge, and it is cut to at most 1,000.
WINDOW = 10_000
KEEP = 1_000
# A 1M window: nothing is huge, only the tool-output limits (50 KB, 2,000 lines) apply.
BIG_WINDOW = 1_000_000
NOTICE_END = "omitted; the full text is preserved in the transcript ...]"


def truncated(draft: Draft) -> dict[int, Entry]:
    return {e.n: e for e in draft.entries if e.edit == "truncated"}


def head_notice_tail(content: str) -> tuple[str, str, str]:
    head, rest = content.split("\n[... ", 1)
    notice, tail = rest.split("]\n", 1)
    return head, f"[... {notice}]", tail


class TestHugeMessages:
    def test_huge_tool_output_is_cut_to_head_and_tail(self) -> None:
        """Reference 000 (one very large message resists eviction): a huge tool result keeps its head and tail within the keep size."""
        output = lines(2000)  # 4,004 tokens
        chat = Chat().user().tool("a", "run_command", {"command": "make"}, output).user()
        ctx = context(WINDOW)
        out = truncate_oversized(chat.draft(), ctx)
        entry = by_n(out.draft)[3]
        assert entry.edit == "truncated"
        assert entry.tokens == COUNTER.message(entry.message) <= KEEP
        head, notice, tail = head_notice_tail(str(entry.message["content"]))
        assert output.startswith(head + "\n")
        assert output.endswith("\n" + tail)
        assert head.startswith("line 0\nline 1\n")
        assert tail.endswith("line 1999")
        assert notice.endswith(NOTICE_END)
        assert out.report is not None
        assert (out.report.stage, out.report.detail) == ("truncate_oversized", "1 message")
        assert (
            out.report.tokens_saved == 4004 - entry.tokens == ctx.tokens(chat.draft()) - ctx.tokens(out.draft)
        )

    def test_messages_under_the_threshold_are_kept(self) -> None:
        """A 2,000-token output is under a quarter of a 10k window and within the tool limits."""
        chat = Chat().user().tool("a", "run_command", {}, words(2000)).user()
        assert truncate_oversized(chat.draft(), context(WINDOW)).report is None

    def test_earlier_huge_paste_is_cut_but_the_latest_user_message_is_not(self) -> None:
        """The latest user message is the request the model must answer, so only the earlier paste is cut."""
        chat = Chat().user(words(3000, "p")).assistant().user(words(3000, "q"))
        out = truncate_oversized(chat.draft(), context(WINDOW))
        assert list(truncated(out.draft)) == [1]
        assert by_n(out.draft)[3] == chat.entries[2]

    def test_huge_assistant_text_is_cut_but_tool_call_arguments_never(self) -> None:
        """Assistant text is cut; a call whose arguments are huge stays whole (its JSON must stay valid)."""
        chat = Chat().user().calls(("w", "write_file", {"path": "a.py", "content": words(3000)}))
        chat.result("w", "ok").assistant(words(3000, "a")).user()
        out = truncate_oversized(chat.draft(), context(WINDOW))
        assert list(truncated(out.draft)) == [4]
        assert by_n(out.draft)[2] == chat.entries[1]

    def test_list_content_cuts_text_parts_and_keeps_images(self) -> None:
        """An earlier text-and-image message has its text cut; the image part is kept as it was."""
        chat = Chat().add({"role": "user", "content": [{"type": "text", "text": lines(1500)}, IMAGE]}).user()
        out = truncate_oversized(chat.draft(), context(WINDOW))
        entry = by_n(out.draft)[1]
        text, image = entry.message["content"]
        assert image == IMAGE
        assert NOTICE_END in text["text"]
        assert entry.tokens == COUNTER.message(entry.message) <= KEEP

    def test_pinned_system_and_chunks_are_untouched(self) -> None:
        """Pinned and system messages are never cut, and summary chunks pass through."""
        chat = Chat(start=2).add({"role": "system", "content": words(3000, "s")}).user()
        chat.calls(("a", "read_file", {"path": "a.py"})).result("a", lines(3000), pinned=True).user()
        draft = chat.draft((chunk(),))
        out = truncate_oversized(draft, context(WINDOW))
        assert out.report is None
        assert out.draft == draft

    def test_idempotent(self) -> None:
        """Truncating a truncated draft changes nothing and reports nothing."""
        chat = Chat().user(words(3000)).tool("a", "run_command", {}, lines(3000)).user()
        once = truncate_oversized(chat.draft(), context(WINDOW))
        assert len(truncated(once.draft)) == 2
        twice = truncate_oversized(once.draft, context(WINDOW))
        assert twice.report is None
        assert twice.draft == once.draft


class TestToolOutputLimits:
    def test_byte_limit(self) -> None:
        """Reference 004 (tool output limits): an output over 50 KB is cut to at most 51,200 bytes, whatever the window."""
        output = words(12_000)  # one line of about 70 KB
        chat = Chat().user().tool("a", "fetch_url", {}, output).user()
        out = truncate_oversized(chat.draft(), context(BIG_WINDOW))
        content = str(by_n(out.draft)[3].message["content"])
        assert 50_000 < len(content.encode()) <= 51_200
        head, notice, tail = head_notice_tail(content)
        assert notice == f"[... {len(output) - len(head) - len(tail):,} characters {NOTICE_END}"

    def test_line_limit(self) -> None:
        """Reference 004: an output over 2,000 lines keeps 2,000 lines, the notice saying how many were omitted."""
        chat = Chat().user().tool("a", "run_command", {}, lines(3000)).user()
        out = truncate_oversized(chat.draft(), context(BIG_WINDOW))
        content = str(by_n(out.draft)[3].message["content"])
        assert content.count("\n") + 1 == 2000
        head, notice, tail = head_notice_tail(content)
        assert (head.split("\n")[-1], tail.split("\n")[0]) == ("line 998", "line 2000")
        assert "(1,001 lines)" in notice

    def test_limits_are_settings(self) -> None:
        """Reference 004 (maxToolOutputBytes, maxToolOutputLines): raising the limits (or None) leaves the same output whole."""
        chat = Chat().user().tool("a", "run_command", {}, lines(3000)).user()
        ctx = context(BIG_WINDOW, max_tool_output_lines=None, max_tool_output_bytes=None)
        assert truncate_oversized(chat.draft(), ctx).report is None

    def test_limits_apply_only_to_tool_outputs(self) -> None:
        """An earlier 3,000-line user paste in a large window is left alone."""
        chat = Chat().user(lines(3000)).assistant().user()
        assert truncate_oversized(chat.draft(), context(BIG_WINDOW)).report is None

    def test_multibyte_text_is_never_split_inside_a_character(self) -> None:
        """A cut through two-byte characters keeps whole characters and stays within the byte limit."""
        output = " ".join(["éééé"] * 15_000)  # 135 KB
        chat = Chat().user().tool("a", "run_command", {}, output).user()
        content = str(by_n(truncate_oversized(chat.draft(), context(BIG_WINDOW)).draft)[3].message["content"])
        head, _, tail = head_notice_tail(content)
        assert set(head) == set(tail) == {"é", " "}
        assert len(content.encode()) <= 51_200


class TestCutText:
    def test_exact_notice(self) -> None:
        """Reference 004 (a notice where output was cut): the notice gives the exact characters and lines omitted between whole-line head and tail."""
        text = lines(100)
        middle = "\n" + "\n".join(f"line {i}" for i in range(5, 95)) + "\n"
        expected = (
            lines(5) + f"\n[... {len(middle):,} characters (90 lines) {NOTICE_END}\n"
            "line 95\nline 96\nline 97\nline 98\nline 99"
        )
        assert cut_text(text, max_bytes=100_000, max_lines=11) == expected

    def test_within_limits_is_none(self) -> None:
        """A text within both limits is not cut."""
        assert cut_text(lines(10), max_bytes=1000, max_lines=10) is None

    @given(
        fragment=st.text(alphabet=st.sampled_from("ab é\n漢"), min_size=1, max_size=60),
        repeat=st.integers(1, 100),
        max_bytes=st.integers(256, 2000),
        max_lines=st.integers(3, 60),
    )
    def test_cut_respects_both_limits_and_keeps_a_prefix_and_a_suffix(
        self, fragment: str, repeat: int, max_bytes: int, max_lines: int
    ) -> None:
        """Any cut is within the byte and line limits and is the text's own head and tail around a notice."""
        text = fragment * repeat
        cut = cut_text(text, max_bytes, max_lines)
        within = len(text.encode()) <= max_bytes and text.count("\n") + 1 <= max_lines
        if cut is None:
            assert within
            return
        assert len(cut.encode()) <= max_bytes
        assert cut.count("\n") + 1 <= max_lines
        head, notice, tail = head_notice_tail(cut)
        assert text.startswith(head)
        assert text.endswith(tail)
        assert len(head) + len(tail) < len(text)
        assert notice.endswith(NOTICE_END)


def plain(count: int) -> str:
    """About ``count`` words with nothing distinctive in them."""
    return " ".join(["this part says nothing rare"] * (count // 5))


class TestTheTask:
    """The task (first user message) and pinned messages: whole up to their budget, then cut with their terms."""

    @staticmethod
    def task_context(budget: int) -> StageContext:
        limits = Limits(
            target=5_000,
            fixed_tokens=0,
            window=WINDOW,
            tail_max_messages=6,
            tail_max_tokens=2_500,
            max_summary_tokens=500,
            chunk_budget=2_500,
            task_max_tokens=budget,
        )
        return context(limits=limits)

    @staticmethod
    def spec(filler: int) -> str:
        """A task statement: plain words at its head and tail, identifiers only in the middle."""
        middle = " ".join(f"module_{i}/file_{i}.py raises Error{i}" for i in range(40))
        return f"Please begin {plain(filler)} {middle} {plain(filler)} and finish"

    def test_a_task_within_its_budget_is_not_cut(self) -> None:
        """Even over the huge-message size: the task's own budget decides."""
        task = words(2_600)
        chat = Chat().user(task).assistant().user()
        assert truncate_oversized(chat.draft(), self.task_context(3_000)).report is None

    def test_a_task_over_its_budget_keeps_head_tail_and_every_term(self) -> None:
        """Head and tail verbatim, the middle's terms in the notice with their context, within budget."""
        task = self.spec(600)
        chat = Chat().user(task).assistant().user()
        out = truncate_oversized(chat.draft(), self.task_context(900))
        entry = by_n(out.draft)[1]
        text = str(entry.message["content"])
        assert entry.edit == "truncated"
        assert entry.tokens <= 900
        assert text.startswith("Please begin this part")
        assert text.endswith("this part says nothing rare and finish")
        for i in range(40):
            assert f"module_{i}/file_{i}.py" in text
            assert f"Error{i}" in text
        (note,) = out.notes
        assert note.startswith("the task (")
        assert "80 of 80 distinctive terms of the part between carried" in note

    def test_what_does_not_fit_is_counted(self) -> None:
        """A budget too small for every term: the note says how many were left out."""
        chat = Chat().user(self.spec(300)).assistant().user()
        out = truncate_oversized(chat.draft(), self.task_context(400))
        (note,) = out.notes
        assert "left out (all in the transcript)" in note
        assert by_n(out.draft)[1].tokens <= 400

    def test_the_task_is_cut_even_as_the_latest_user_message(self) -> None:
        """An agent run has one user message: kept, it must still fit its budget."""
        chat = Chat().user(self.spec(600)).assistant()
        out = truncate_oversized(chat.draft(), self.task_context(900))
        assert by_n(out.draft)[1].edit == "truncated"

    def test_system_messages_are_never_cut(self) -> None:
        """However large: the runtime's instructions stay whole."""
        chat = Chat().add({"role": "system", "content": words(4_000)}).user("go").assistant().user()
        assert truncate_oversized(chat.draft(), self.task_context(900)).report is None

    def test_a_pinned_message_has_the_same_budget(self) -> None:
        """A runtime-pinned message over the budget is cut like the task."""
        pinned = {"role": "assistant", "content": self.spec(600), "pinned": True}
        chat = Chat().user("short task").add(pinned).user()
        out = truncate_oversized(chat.draft(), self.task_context(900))
        assert by_n(out.draft)[2].edit == "truncated"
        assert out.notes[0].startswith("a pinned message (")
